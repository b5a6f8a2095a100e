"""The ``torch.compile`` backend ``"fuser"``: fuse FFNs in the graph Dynamo captures, Inductor for the rest.

    model = torch.compile(model, backend="fuser")

works on any model, ``fuser.optimize`` or not: ``rewrite_ffns`` finds, in Dynamo's torch-level FX
graph, ``linear -> activation -> [dropout p=0] -> linear`` and the gated form
``linear(act(linear(x, Wg)) * linear(x, Wu), Wd)`` (either operand order), and replaces each with one
call of ``torch.ops.fuser.ffn``; then the graph goes to Inductor (``compile_fx``), which treats the op
as an opaque kernel (its fake implementation gives shapes) and compiles everything else as usual.
Matched activations are the functional ones Dynamo records for ``nn.ReLU``/``nn.GELU``/``nn.SiLU`` and
the Hugging Face/timm classes that call them (``F.relu``, ``F.gelu`` with ``approximate`` "none" or
"tanh", ``F.silu``); a GELU written out as a tanh formula (GPT-2's ``gelu_new``) is left to Inductor.

The backend is found two ways: the ``torch_dynamo_backends`` entry point in the package metadata (an
installed fuser needs no import), and ``torch._dynamo.register_backend`` when this module is imported
without that entry point (a source checkout on ``sys.path``). Importing it again, or
``importlib.reload``, is harmless (a re-run notebook cell).
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

import fuser.custom_op  # noqa: F401  (registers torch.ops.fuser.ffn)
from fuser.ffn_spec import DTYPES

__all__ = ["fuser_backend", "rewrite_ffns"]

_LINEAR = {F.linear, torch._C._nn.linear}
_MUL = {operator.mul, torch.mul, torch.Tensor.mul}
_DROPOUT = {F.dropout, torch.dropout}


def _activation(n):
    """The fuser activation name of a call node, or None."""
    if n.op != "call_function" or len(n.args) != 1:
        return None
    kw = dict(n.kwargs)
    kw.pop("inplace", None)
    if n.target in (F.relu, torch.relu) and not kw:
        return "relu"
    if n.target in (F.silu, torch._C._nn.silu) and not kw:
        return "silu"
    if n.target in (F.gelu, torch._C._nn.gelu) and set(kw) <= {"approximate"}:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(kw.get("approximate", "none"))
    return None


def _linear(n):
    """``(x, weight, bias)`` of a linear node, or None."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function" or n.target not in _LINEAR:
        return None
    names = ("input", "weight", "bias")
    args = list(n.args) + [None] * (3 - len(n.args))
    for i, name in enumerate(names):
        if name in n.kwargs:
            args[i] = n.kwargs[name]
    return tuple(args[:3])


def _skip_dropout(n):
    """Through an inactive dropout (p=0 or training=False): what it reads; else the node itself."""
    if isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _DROPOUT and len(n.users) == 1:
        args = list(n.args) + [None] * (4 - len(n.args))
        p = n.kwargs.get("p", args[1] if args[1] is not None else 0.5)
        training = n.kwargs.get("training", args[2] if args[2] is not None else True)
        if p == 0 or training is False:
            return n.args[0], [n]
    return n, []


def _val(n):
    return n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else None


def _tensors_ok(x, weights, biases):
    """Whether the example values say fuser.ffn takes these: one supported dtype, 2-D contiguous
    weights, 1-D biases."""
    xv = _val(x)
    vals = [_val(w) for w in weights] + [_val(b) for b in biases if b is not None]
    if not isinstance(xv, torch.Tensor) or any(not isinstance(v, torch.Tensor) for v in vals):
        return False
    if xv.dtype not in DTYPES or any(v.dtype != xv.dtype or v.device != xv.device for v in vals):
        return False
    return all(_val(w).dim() == 2 and _val(w).is_contiguous() for w in weights) and \
        all(_val(b).dim() == 1 and _val(b).is_contiguous() for b in biases if b is not None)


def _single_user(*nodes):
    return all(isinstance(n, torch.fx.Node) and len(n.users) == 1 for n in nodes)


def _match(down):
    """The FFN ending at linear node ``down``: (op args, nodes to erase), or None."""
    lin = _linear(down)
    if lin is None:
        return None
    h, w_down, b_down = lin
    h, drops = _skip_dropout(h)
    if not _single_user(h):
        return None
    dead = [down, *drops, h]
    if h.op == "call_function" and h.target in _MUL and len(h.args) == 2 and not h.kwargs:
        for a, u in (h.args, h.args[::-1]):
            act = _activation(a) if isinstance(a, torch.fx.Node) else None
            g, up = (_linear(a.args[0]) if act else None), _linear(u)
            if act and g and up and g[0] is up[0] and _single_user(a, a.args[0], u):
                x, args = g[0], (up[1], w_down, g[1], up[2], g[2], b_down)
                if _tensors_ok(x, (up[1], w_down, g[1]), (up[2], g[2], b_down)):
                    return (x, *args, act), dead + [a, a.args[0], u]
        return None
    act = _activation(h)
    up = _linear(h.args[0]) if act else None
    if up and _single_user(h.args[0]) and _tensors_ok(up[0], (up[1], w_down), (up[2], b_down)):
        x = up[0]
        return (x, up[1], w_down, None, up[2], None, b_down, act), dead + [h.args[0]]
    return None


def rewrite_ffns(gm):
    """Replace every FFN pattern in FX graph module ``gm`` with ``torch.ops.fuser.ffn``, in place.

    Returns how many were replaced. Only graphs with example values on their nodes (what Dynamo
    records) are rewritten: the dtypes and layouts must be ones fuser takes.

    Example:
        >>> import torch, fuser.backend
        >>> from torch import nn
        >>> seen = []
        >>> def capture(gm, example_inputs):
        ...     seen.append(fuser.backend.rewrite_ffns(gm))
        ...     return gm.forward
        >>> mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        >>> _ = torch.compile(mlp, backend=capture)(torch.randn(4, 16))
        >>> seen
        [1]
    """
    count, erased = 0, set()
    for node in reversed(list(gm.graph.nodes)):
        if node in erased or node.op != "call_function" or node.target not in _LINEAR:
            continue
        found = _match(node)
        if found is None:
            continue
        args, dead = found
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(torch.ops.fuser.ffn.default, args)
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        for n in dead:   # consumers first, so each has no users left when erased
            gm.graph.erase_node(n)
            erased.add(n)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def fuser_backend(gm, example_inputs, *, inner=None):
    """The ``"fuser"`` backend: ``rewrite_ffns(gm)``, then compile with ``inner`` (default Inductor's
    ``compile_fx``; a backend name such as ``"aot_eager"``, or a backend callable).

    Example:
        >>> import functools, torch, fuser.backend
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 16))
        >>> compiled = torch.compile(mlp, backend=functools.partial(fuser.backend.fuser_backend, inner="aot_eager"))
        >>> x = torch.randn(4, 16)
        >>> torch.allclose(compiled(x), mlp(x), atol=1e-5)
        True
    """
    rewrite_ffns(gm)
    if inner is None:
        from torch._inductor.compile_fx import compile_fx   # imported on first use: Inductor loads slowly
        return compile_fx(gm, example_inputs)
    if isinstance(inner, str):
        inner = torch._dynamo.lookup_backend(inner)
    return inner(gm, example_inputs)


def _register():
    """Register ``"fuser"`` with Dynamo unless it is already known (registered, or found through the
    entry point: then Dynamo registers it itself on first use, and registering here too would make
    that registration fail as a duplicate)."""
    if "fuser" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(fuser_backend, name="fuser")


_register()

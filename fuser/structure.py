"""Recognising an FFN by its structure, for modules of classes no table knows.

``nn.Sequential(Linear, act, [Dropout], Linear, [Dropout])``, and any other module whose ``forward``
traces (torch.fx, in eval mode, dropout functions that do nothing left out) to ``down(act(up(x)))`` or
``down(act(gate(x)) * up(x))``; traced in training mode too, to know whether it computes the same there
(else the module's own forward runs in training: ``FFNSpec.train_source``). A module shaped like one (two
or three projections) that does not match is a ``NearMiss``, whose message says what differs (a norm
between the Linears, 1x1 convolutions, more than the FFN).
"""
from __future__ import annotations

import functools
import inspect
import operator

import torch
import torch.nn.functional as F
from torch import nn

from fuser.ffn_spec import Unsupported, build_spec, is_linear, own_state

__all__ = ["NearMiss", "DROPOUTS", "DROPOUT_FUNCTIONS", "from_sequential", "from_structure"]

class NearMiss(Exception):
    """A module shaped like an FFN (two or three projections) that fuser does not match as one; the message
    says what differs. ``fuser.report`` lists it with that reason."""


#: dropout modules: the identity at inference; in training a FusedFFN calls them as they are
DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
#: dropout functions -> the default of their ``training`` argument (None: a required argument)
DROPOUT_FUNCTIONS = {F.dropout: True, F.dropout1d: True, F.dropout2d: True, F.dropout3d: True,
                     F.alpha_dropout: False, F.feature_alpha_dropout: False, torch.dropout: None,
                     torch.alpha_dropout: None, torch.feature_alpha_dropout: None}


def _dropout_like(m):
    return isinstance(m, (*DROPOUTS, nn.Identity))


def _is_norm(m):
    return isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)) \
        or "Norm" in type(m).__name__


def _is_conv1x1(m):
    return isinstance(m, (nn.Conv1d, nn.Conv2d)) and all(k == 1 for k in m.kernel_size)


def _describe(name, m):
    """A child as a near miss's reason names it."""
    what = f"{type(m).__name__} {name!r}"
    return f"a norm ({what})" if _is_norm(m) else what


def _projections(named):
    """Which children the FFN's projections would be: linear layers when there are two or three, else
    1x1 convolutions when there are two or three of those and no linear layer (a near miss at best); None
    when neither."""
    for is_proj in (is_linear, _is_conv1x1):
        n = sum(is_proj(m) for _, m in named)
        if 2 <= n <= 3:
            return is_proj
        if n:
            return None
    return None


def _conv_miss(named):
    convs = [n for n, m in named if _is_conv1x1(m)]
    return NearMiss(f"1x1 convolutions ({type(dict(named)[convs[0]]).__name__} {', '.join(map(repr, convs))}) "
                    "where fuser reads nn.Linear layers (a convolution's channels-first layout is not the "
                    "[tokens, features] one)")


def from_sequential(seq):
    """``Sequential(Linear, act, [Dropout], Linear, [Dropout])`` -> ``FFNSpec``; None if it is not two
    projections; raises ``NearMiss`` when it is two projections with something else around them, or two
    1x1 convolutions around an activation.

    Example:
        >>> from torch import nn
        >>> from fuser.structure import NearMiss, from_sequential
        >>> from_sequential(nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))).d_ff
        32
        >>> try:
        ...     from_sequential(nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 8)))
        ... except NearMiss as e:
        ...     print(e)
        a norm (LayerNorm '1') between the two Linears
    """
    items = list(seq.named_children())
    is_proj = _projections(items) if len(items) <= 6 else None
    lin = [i for i, (_, m) in enumerate(items) if is_proj and is_proj(m)]
    if len(lin) != 2:
        return None
    (i_up, i_down), names, mods = lin, [n for n, _ in items], [m for _, m in items]
    between, after = items[i_up + 1:i_down], items[i_down + 1:]
    norm = next((c for c in between if _is_norm(c[1])), None)
    if i_up:
        miss = f"{_describe(*items[0])} before the up projection"
    elif norm or not between:
        miss = f"{_describe(*norm)} between the two Linears" if norm else "no activation between the two Linears"
    elif len(between) > 2 or not all(_dropout_like(m) for _, m in between[1:]):
        miss = f"{', '.join(_describe(*c) for c in between[1:])} between the two Linears besides the activation"
    elif len(after) > 1 or not all(_dropout_like(m) for _, m in after):
        miss = f"{', '.join(_describe(*c) for c in after)} after the down projection"
    else:
        miss = own_state(seq) and f"the module holds tensors of its own ({', '.join(own_state(seq))})"
    if is_proj is _is_conv1x1:   # convolutions: a near miss only where Linears would make an FFN
        if miss:
            return None
        raise _conv_miss(items)
    if miss:
        raise NearMiss(miss)
    return build_spec("Sequential", dict(items), up=names[0], down=names[i_down], act_obj=mods[1],
                      mid_dropout=between[1][0] if len(between) == 2 else None,
                      post_dropout=after[0][0] if after else None)


class _LeafTracer(torch.fx.Tracer):
    """Stops at every child: the structural match reads which children are called, not their insides."""

    def is_leaf_module(self, m, qualname):
        return True


def _inference_noop(n):
    """Whether graph node `n` is a dropout function that is the identity as traced (training off, or p=0)."""
    if n.op != "call_function" or n.target not in DROPOUT_FUNCTIONS or not n.args:
        return False
    args = dict(zip(("p", "training"), n.args[1:3]), **n.kwargs)
    p, training = args.get("p", 0.5), args.get("training", args.get("train", DROPOUT_FUNCTIONS[n.target]))
    return isinstance(p, (int, float)) and isinstance(training, bool) and (not training or p == 0)


def _trace(module, training):
    """The graph of ``module.forward`` traced with ``module.training`` set to `training` (children are
    leaves, so only the module's own flag matters), dropout functions that do nothing left out."""
    was = module.training
    module.training = training
    try:
        graph = _LeafTracer().trace(module)
    finally:
        module.training = was
    for n in list(graph.nodes):
        if _inference_noop(n):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    return graph


def _traced_pattern(module, graph, is_proj=is_linear):
    """Match ``down([drop](act(up(x)) | act(gate(x)) * up(x)))[drop]`` in `graph` (``_trace``'s), where
    ``is_proj`` says which children are projections.

    Returns keyword arguments for ``build_spec``; raises ``NearMiss`` saying where the forward differs."""
    nodes = list(graph.nodes)
    ph = [n for n in nodes if n.op == "placeholder"]
    out = [n for n in nodes if n.op == "output"]
    if len(ph) != 1 or len(out) != 1 or not isinstance(out[0].args[0], torch.fx.Node):
        raise NearMiss("its forward does not return one tensor")
    x, used = ph[0], set(ph + out)

    def child(n):
        return getattr(module, n.target) if n.op == "call_module" and "." not in n.target else None

    def what(n):
        m = child(n) if isinstance(n, torch.fx.Node) else None
        if m is not None:
            return _describe(n.target, m)
        if isinstance(n, torch.fx.Node) and n.op in ("call_function", "call_method"):
            return getattr(n.target, "__name__", str(n.target)) + "()"
        return "the input" if n is x else repr(n)

    def single(n):
        return isinstance(n, torch.fx.Node) and len(n.users) == 1 and not n.kwargs

    def proj(n):
        return isinstance(n, torch.fx.Node) and n.op == "call_module" and is_proj(child(n))

    def linear_of(n):   # a projection applied to x
        if proj(n) and n.args == (x,) and not n.kwargs:
            used.add(n)
            return n.target
        if proj(n) and len(n.args) == 1:
            raise NearMiss(f"{what(n.args[0])} before the up projection")
        return None

    def act_of(n):      # an activation (a parameter-free child, or a function) applied to one node
        if not isinstance(n, torch.fx.Node) or len(n.args) != 1 or len(n.users) != 1:
            return None
        m = child(n)
        if m is not None and not is_proj(m) and (_is_norm(m) or any(True for _ in m.parameters())):
            raise NearMiss(f"{what(n)} between the two Linears")
        if n.op == "call_module" and not n.kwargs and m is not None and not is_proj(m):
            used.add(n)
            return n.args[0], m
        if n.op == "call_function" and set(n.kwargs) <= {"inplace", "approximate"}:
            # any one-input function: activation_of says whether fuser supports it
            used.add(n)
            fn = n.target
            if fn is F.gelu and n.kwargs.get("approximate", "none") != "none":
                fn = functools.partial(F.gelu, approximate=n.kwargs["approximate"])
            return n.args[0], fn
        return None

    def drop_of(n):     # an optional dropout child
        m = child(n) if isinstance(n, torch.fx.Node) else None
        if m is not None and _dropout_like(m) and single(n) and len(n.args) == 1:
            used.add(n)
            return n.args[0], n.target
        return n, None

    h, post = drop_of(out[0].args[0])
    if not (proj(h) and single(h) and len(h.args) == 1):
        raise NearMiss(f"its output comes from {what(h)}, not from a Linear")
    down = h.target
    used.add(h)
    h, mid = drop_of(h.args[0])
    spec = dict(down=down, mid_dropout=mid, post_dropout=post)
    if isinstance(h, torch.fx.Node) and h.op == "call_function" and h.target in (operator.mul, torch.mul) \
            and single(h) and len(h.args) == 2:
        used.add(h)
        for a, b in (h.args, h.args[::-1]):
            got = act_of(a)
            if got and linear_of(got[0]) and linear_of(b):
                spec.update(gate=got[0].target, act_obj=got[1], up=b.target)
                break
        else:
            raise NearMiss(f"the product before {down!r} is not act(Linear(x)) * Linear(x)")
    else:
        got = act_of(h)
        if not got:
            raise NearMiss(f"{what(h)} between the two Linears, where fuser expects an activation")
        if not linear_of(got[0]):
            raise NearMiss(f"{what(got[0])} between the two Linears")
        spec.update(up=got[0].target, act_obj=got[1])
    extra = [n for n in nodes if n not in used]
    if extra:
        raise NearMiss(f"its forward does more than the FFN ({', '.join(what(n) for n in extra[:3])}"
                       f"{', ...' if len(extra) > 3 else ''})")
    return spec


def _one_input(module):
    """Whether ``module.forward`` takes exactly one input (only those are traced)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.default is p.empty and p.kind in positional]
    extra = [p for p in params if p not in required and p.kind is not inspect.Parameter.VAR_KEYWORD]
    return len(required) == 1 and not extra


def _same(a, b):
    """Whether two matches name the same FFN (activation functions compared by what they compute)."""
    def key(d):
        act = d["act_obj"]
        return {**d, "act_obj": (act.func, act.keywords) if isinstance(act, functools.partial) else act}
    return key(a) == key(b)


#: what mixes tokens or reshapes: a forward calling any of these is not an FFN (attention, say)
_NOT_FFN = {"matmul", "bmm", "baddbmm", "einsum", "softmax", "scaled_dot_product_attention", "reshape", "view",
            "transpose", "permute", "flatten", "unflatten"}


def from_structure(module):
    """``FFNSpec`` of a module whose forward (at inference) is an FFN of its children; None if it is not
    shaped like one; raises ``NearMiss`` when it is, and its forward differs from an FFN of them.

    Example:
        >>> import torch.nn.functional as F
        >>> from torch import nn
        >>> from fuser.structure import from_structure
        >>> class Mlp(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w1, self.w3, self.w2 = nn.Linear(8, 32), nn.Linear(8, 32), nn.Linear(32, 8)
        ...     def forward(self, x):
        ...         return self.w2(F.silu(self.w1(x)) * self.w3(x))
        >>> spec = from_structure(Mlp())
        >>> spec.activation, spec.gate.owner, spec.up.owner
        ('silu', 'w1', 'w3')
    """
    named = list(module.named_children())
    is_proj = _projections(named)
    if is_proj is None or not _one_input(module):
        return None
    try:
        graph = _trace(module, False)
    except Exception as e:   # noqa: BLE001 - a forward FX cannot trace is not a recognised FFN
        if is_proj is _is_conv1x1:
            return None
        raise NearMiss(f"torch.fx cannot trace its forward ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    if any(getattr(n.target, "__name__", n.target) in _NOT_FFN for n in graph.nodes):
        return None
    if is_proj is _is_conv1x1:   # convolutions: a near miss only where Linears would make an FFN
        try:
            _traced_pattern(module, graph, is_proj)
        except NearMiss:
            return None
        raise _conv_miss(named)
    found = _traced_pattern(module, graph)
    own = own_state(module)
    if own:
        raise NearMiss(f"the module holds tensors of its own ({', '.join(own)})")
    try:     # in training mode, does the forward compute the same FFN?
        same = _same(found, _traced_pattern(module, _trace(module, True)))
    except Exception:   # noqa: BLE001 - it differs there: a dropout function, a branch on self.training
        same = False
    spec = build_spec(type(module).__name__, dict(named), train_source=not same, **found)
    if spec.transposed and spec.train_source:
        raise Unsupported("its forward differs in training mode, where it must run itself, and fuser would "
                          "relay its Conv1D weights out")
    return spec

"""Recognising FFNs in a module tree: what ``fuser.optimize`` swaps and ``fuser.report`` lists.

Three ways in, each a table or a pattern, never a guess:

- ``KNOWN``: known classes (Hugging Face, timm), keyed by (top-level package, class name), each mapped
  to a ``Recipe`` naming which child plays which role (gate, up, down, or one fused gate/up linear),
  where the activation lives, and which dropouts and norms sit where.
- ``PAIRS``: FFNs split over two sibling modules (BERT's ``intermediate`` + ``output``); only the
  GEMM -> activation -> GEMM part is fused, the dropout, residual and LayerNorm stay in the sibling.
- structure: ``nn.Sequential(Linear, act, [Dropout], Linear, [Dropout])``, and any other module whose
  ``forward`` traces (torch.fx) to ``down(act(up(x)))`` or ``down(act(gate(x)) * up(x))``.

The activation is read from the module object (``ACT_CLASSES``, ``ACT_FUNCTIONS``): an activation, a
dtype, a layout or a feature fuser does not support makes the FFN a skip, with the reason.

What a recogniser produces is an ``FFNSpec``: where each weight lives (owner child, parameter name,
row range for fused gate/up weights), the activation and the dimensions. ``FusedFFN`` computes from it.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

#: dtypes fuser computes in
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Unsupported(Exception):
    """An FFN was found but cannot be fused; the message says why."""


def _key(obj):
    """(top-level package, class name) of an object's type: the key of every table here."""
    cls = type(obj)
    return cls.__module__.split(".")[0], cls.__name__


# ---- activations ------------------------------------------------------------------------------------

def _nn_gelu(m):
    return {"none": "gelu", "tanh": "gelu_tanh"}.get(getattr(m, "approximate", None))


#: activation module class -> fuser activation name (or a function of the module giving it, or None)
ACT_CLASSES: dict[tuple[str, str], Union[str, Callable[[nn.Module], Optional[str]]]] = {
    ("torch", "ReLU"): "relu",
    ("torch", "SiLU"): "silu",
    ("torch", "GELU"): _nn_gelu,
    ("transformers", "SiLUActivation"): "silu",
    ("transformers", "GELUActivation"): "gelu",             # F.gelu, or the same erf formula in Python
    ("transformers", "GELUTanh"): "gelu_tanh",              # "gelu_pytorch_tanh"
    ("transformers", "PytorchGELUTanh"): "gelu_tanh",       # its older name
    ("transformers", "NewGELUActivation"): "gelu_tanh",     # "gelu_new": the tanh formula written out
    ("transformers", "FastGELUActivation"): "gelu_tanh",    # "gelu_fast": the same formula, factored
    ("transformers", "AccurateGELUActivation"): "gelu_tanh",  # "gelu_accurate": sqrt(2/pi) precomputed
    ("timm", "GELU"): "gelu",
    ("timm", "GELUTanh"): "gelu_tanh",
    ("timm", "Swish"): "silu",
}

#: activation function -> fuser activation name (functions that modules call directly)
ACT_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", F.silu: "silu", F.gelu: "gelu"}


def activation_of(obj):
    """The fuser activation name of an activation module or function; raises ``Unsupported``.

    Example:
        >>> from torch import nn
        >>> from fuser.recognize import activation_of
        >>> activation_of(nn.GELU(approximate="tanh"))
        'gelu_tanh'
    """
    if isinstance(obj, functools.partial) and obj.func is F.gelu and not obj.args \
            and set(obj.keywords) <= {"approximate"}:
        name = {"none": "gelu", "tanh": "gelu_tanh"}.get(obj.keywords.get("approximate", "none"))
        if name:
            return name
    if isinstance(obj, nn.Module):
        entry = ACT_CLASSES.get(_key(obj))
        name = entry(obj) if callable(entry) else entry
        if name:
            return name
    elif obj in ACT_FUNCTIONS:
        return ACT_FUNCTIONS[obj]
    _unsupported_act(obj)


def _unsupported_act(obj):
    what = type(obj).__name__ if isinstance(obj, nn.Module) else getattr(obj, "__name__", repr(obj))
    if isinstance(obj, nn.GELU):
        what = f"GELU(approximate={obj.approximate!r})"
    raise Unsupported(f"activation {what} is not one fuser supports (relu, gelu, gelu_tanh, silu)")


# ---- linear layers ----------------------------------------------------------------------------------

#: linear layer class -> weight layout; "linear" is [out, in], "conv1d" is GPT-2's transposed [in, out]
LINEAR_CLASSES = {
    ("torch", "Linear"): "linear",
    ("transformers", "FalconLinear"): "linear",   # x @ W.T + b, the same computation as nn.Linear
    ("transformers", "Conv1D"): "conv1d",         # addmm(b, x, W) with W stored [in, out]
}


def linear_layout(m, role):
    """'linear' or 'conv1d' for a linear layer fuser can read; raises ``Unsupported`` otherwise."""
    layout = LINEAR_CLASSES.get(_key(m))
    if layout is None:
        kind = "a subclass of nn.Linear (quantised, adapter, ...)" if isinstance(m, nn.Linear) else "not a linear layer"
        raise Unsupported(f"{role} is {type(m).__name__}, {kind}; fuser reads plain nn.Linear weights")
    return layout


def _is_linear(m):
    return _key(m) in LINEAR_CLASSES or isinstance(m, nn.Linear)


# ---- the spec a FusedFFN computes from ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WeightRef:
    """Where one tensor lives: ``owner`` (a child's name), its attribute ``name``, and a row range when
    it is one half of a fused gate/up weight (a contiguous, zero-copy slice)."""
    owner: str
    name: str
    rows: Optional[tuple[int, int]] = None


@dataclasses.dataclass(frozen=True)
class FFNSpec:
    """Everything ``FusedFFN`` needs: roles of the weights, activation, dimensions, dropouts."""
    kind: str
    activation: str
    d_model: int
    d_ff: int
    d_out: int
    up: WeightRef
    down: WeightRef
    gate: Optional[WeightRef] = None
    b_up: Optional[WeightRef] = None
    b_gate: Optional[WeightRef] = None
    b_down: Optional[WeightRef] = None
    mid_dropout: Optional[str] = None     # a dropout on the intermediate (active only in training)
    post_dropout: Optional[str] = None    # a dropout on the output
    transposed: tuple[str, ...] = ()      # owners whose [in, out] Conv1D weight is relaid out at swap
    linked: tuple[str, ...] = ()          # owners living outside the module (a sibling's linear)

    @property
    def gated(self):
        return self.gate is not None


# ---- known classes ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to read one known FFN class: child names per role.

    ``gate_up`` names one linear whose output rows hold both halves; ``gate_first`` says the gate is the
    first half (True/False), or is a function of the module (timm's ``gate_last`` attribute).
    """
    down: str
    act: str
    up: Optional[str] = None
    gate: Optional[str] = None
    gate_up: Optional[str] = None
    gate_first: Union[bool, Callable[[nn.Module], bool]] = True
    mid_dropout: Optional[str] = None
    post_dropout: Optional[str] = None
    norm: Optional[str] = None


_SWIGLU_HF = Recipe(gate="gate_proj", up="up_proj", down="down_proj", act="act_fn")
_H_4H = Recipe(up="dense_h_to_4h", down="dense_4h_to_h", act="act")

#: (package, class name) -> Recipe
KNOWN: dict[tuple[str, str], Recipe] = {
    ("transformers", "LlamaMLP"): _SWIGLU_HF,
    ("transformers", "MistralMLP"): _SWIGLU_HF,
    ("transformers", "Qwen2MLP"): _SWIGLU_HF,
    ("transformers", "Qwen3MLP"): _SWIGLU_HF,
    ("transformers", "GemmaMLP"): _SWIGLU_HF,
    ("transformers", "Phi3MLP"): Recipe(gate_up="gate_up_proj", gate_first=True, down="down_proj",
                                        act="activation_fn"),
    ("transformers", "GPT2MLP"): Recipe(up="c_fc", down="c_proj", act="act", post_dropout="dropout"),
    ("transformers", "GPTNeoXMLP"): _H_4H,
    ("transformers", "FalconMLP"): _H_4H,     # its hidden_dropout is applied by the decoder layer
    ("transformers", "T5DenseGatedActDense"): Recipe(gate="wi_0", up="wi_1", down="wo", act="act",
                                                     mid_dropout="dropout"),
    ("transformers", "T5DenseActDense"): Recipe(up="wi", down="wo", act="act", mid_dropout="dropout"),
    ("timm", "Mlp"): Recipe(up="fc1", down="fc2", act="act", mid_dropout="drop1", norm="norm",
                            post_dropout="drop2"),
    ("timm", "GluMlp"): Recipe(gate_up="fc1", gate_first=lambda m: not m.gate_last, down="fc2", act="act",
                               mid_dropout="drop1", norm="norm", post_dropout="drop2"),
    ("timm", "SwiGLU"): Recipe(gate="fc1_g", up="fc1_x", down="fc2", act="act", mid_dropout="drop1",
                               norm="norm", post_dropout="drop2"),
}


@dataclasses.dataclass(frozen=True)
class PairRecipe:
    """An FFN split over two siblings: ``up`` and ``act`` in the first, ``down`` in ``sibling``, which
    keeps its dropout, residual and norm (its ``down`` linear becomes a pass-through)."""
    sibling: str
    sibling_kind: tuple[str, str]
    up: str
    act: str
    down: str


#: (package, class name) of the first module -> PairRecipe
PAIRS: dict[tuple[str, str], PairRecipe] = {
    ("transformers", "BertIntermediate"): PairRecipe(sibling="output", sibling_kind=("transformers", "BertOutput"),
                                                     up="dense", act="intermediate_act_fn", down="dense"),
}


# ---- building and checking a spec --------------------------------------------------------------------

def _child(module, name, role):
    m = getattr(module, name, None)
    if not isinstance(m, nn.Module):
        raise Unsupported(f"{role} {name!r} is missing")
    return m


def _check_dropout(d, name):
    if d is not None and d.training and d.p > 0:
        raise Unsupported(f"dropout {name!r} (p={d.p}) between the GEMMs is active in training mode; "
                          "call model.eval() first (or set p=0)")


def _tensor_ok(t, what):
    if t.dtype not in DTYPES:
        raise Unsupported(f"{what} is {t.dtype}; fuser computes in bfloat16, float16 or float32")
    if t.device.type != "meta":
        if not t.is_contiguous():
            raise Unsupported(f"{what} is not contiguous")
        if t.data_ptr() % 16:
            raise Unsupported(f"{what} is not 16-byte aligned")


def build_spec(kind, owners, *, up, down, act_obj, gate=None, gate_up=None, gate_first=True,
               mid_dropout=None, post_dropout=None, linked=()):
    """Check the parts of one FFN and return its ``FFNSpec``; raises ``Unsupported`` with the reason.

    ``owners`` maps child names to modules; ``up``/``down``/``gate``/``gate_up`` name linear children;
    ``mid_dropout``/``post_dropout`` name dropout children (or are None).

    Example:
        >>> from torch import nn
        >>> from fuser.recognize import build_spec
        >>> seq = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
        >>> build_spec("Sequential", dict(seq.named_children()), up="0", down="2", act_obj=seq[1]).d_ff
        32
    """
    activation = activation_of(act_obj)
    roles = {"up": up, "down": down, "gate": gate, "gate_up": gate_up}
    layouts = {r: linear_layout(owners[n], f"{r} projection {n!r}") for r, n in roles.items() if n}
    if len(set(layouts.values())) > 1:
        raise Unsupported("linear layers of mixed layouts (Linear and Conv1D)")
    conv1d = "conv1d" in layouts.values()

    def wshape(name):   # [out, in] whatever the storage layout
        w = owners[name].weight
        if w.dim() != 2:
            raise Unsupported(f"{name}.weight is {w.dim()}-D")
        return (w.shape[1], w.shape[0]) if conv1d else tuple(w.shape)

    d_ff2, d_model = wshape(gate_up or up)
    d_out, d_ff = wshape(down)
    refs = {}
    if gate_up:
        if d_ff2 != 2 * d_ff:
            raise Unsupported(f"{gate_up} has {d_ff2} outputs, expected 2 x d_ff = {2 * d_ff}")
        g_rows, u_rows = ((0, d_ff), (d_ff, 2 * d_ff)) if gate_first else ((d_ff, 2 * d_ff), (0, d_ff))
        refs["gate"], refs["up"] = WeightRef(gate_up, "weight", g_rows), WeightRef(gate_up, "weight", u_rows)
        if owners[gate_up].bias is not None:
            refs["b_gate"], refs["b_up"] = WeightRef(gate_up, "bias", g_rows), WeightRef(gate_up, "bias", u_rows)
    else:
        for role, name in (("up", up), ("gate", gate)):
            if name is None:
                continue
            if wshape(name) != (d_ff, d_model):
                raise Unsupported(f"{role} projection {name} is {list(wshape(name))}, expected {[d_ff, d_model]}")
            refs[role] = WeightRef(name, "weight")
            if owners[name].bias is not None:
                refs["b_" + role] = WeightRef(name, "bias")
    if d_ff2 != (2 * d_ff if gate_up else d_ff):
        raise Unsupported(f"up projection has {d_ff2} outputs but the down projection takes {d_ff}")
    refs["down"] = WeightRef(down, "weight")
    if owners[down].bias is not None:
        refs["b_down"] = WeightRef(down, "bias")
    tensors = {f"{r.owner}.{r.name}": getattr(owners[r.owner], r.name) for r in refs.values()}
    first = next(iter(tensors.values()))
    for what, t in tensors.items():
        if t.dtype != first.dtype or t.device != first.device:
            raise Unsupported(f"mixed dtypes or devices ({what} is {t.dtype} on {t.device}, "
                              f"others {first.dtype} on {first.device})")
        _tensor_ok(t, what)
    for r in refs.values():   # the zero-copy halves of a fused gate/up weight must be aligned too
        if r.rows and first.device.type != "meta":
            t = getattr(owners[r.owner], r.name)[r.rows[0]:r.rows[1]]
            if t.data_ptr() % 16:
                raise Unsupported(f"half of {r.owner}.{r.name} is not 16-byte aligned")
    if mid_dropout is not None:
        _check_dropout(owners[mid_dropout], mid_dropout)
    transposed = tuple(sorted({n for n in (up, down, gate, gate_up) if n})) if conv1d else ()
    return FFNSpec(kind=kind, activation=activation, d_model=d_model, d_ff=d_ff, d_out=d_out,
                   mid_dropout=mid_dropout, post_dropout=post_dropout, transposed=transposed,
                   linked=tuple(linked), **refs)


def _own_state(module):
    """Names of parameters/buffers a module holds itself (not through children): they would be lost."""
    return [n for n, _ in module.named_parameters(recurse=False)] + \
        [n for n, _ in module.named_buffers(recurse=False)]


def from_recipe(module, recipe):
    """The ``FFNSpec`` of a module of a known class; raises ``Unsupported``."""
    own = _own_state(module)
    if own:
        raise Unsupported(f"the module holds tensors of its own ({', '.join(own)})")
    if recipe.norm is not None and not isinstance(_child(module, recipe.norm, "norm"), nn.Identity):
        raise Unsupported(f"a norm layer ({type(getattr(module, recipe.norm)).__name__}) sits between the GEMMs")
    names = [n for n in (recipe.up, recipe.gate, recipe.gate_up, recipe.down, recipe.mid_dropout,
                         recipe.post_dropout) if n]
    owners = {n: _child(module, n, "child") for n in names}
    for n in (recipe.up, recipe.gate, recipe.gate_up, recipe.down):
        if n and not _is_linear(owners[n]):
            if isinstance(owners[n], nn.Conv2d):
                raise Unsupported(f"{n} is a 1x1 Conv2d (use_conv=True, NCHW layout)")
            linear_layout(owners[n], n)
    gate_first = recipe.gate_first(module) if callable(recipe.gate_first) else recipe.gate_first
    return build_spec(_key(module)[1], owners, up=recipe.up, down=recipe.down,
                      act_obj=getattr(module, recipe.act), gate=recipe.gate, gate_up=recipe.gate_up,
                      gate_first=gate_first, mid_dropout=recipe.mid_dropout, post_dropout=recipe.post_dropout)


def from_pair(first, sibling, recipe):
    """The ``FFNSpec`` of an FFN split over two siblings (the down linear is registered as linked)."""
    owners = {recipe.up: _child(first, recipe.up, "up projection"),
              "down": _child(sibling, recipe.down, "down projection")}
    return build_spec(_key(first)[1], owners, up=recipe.up, down="down", act_obj=getattr(first, recipe.act),
                      linked=("down",))


# ---- structure ----------------------------------------------------------------------------------------

def _dropout_like(m):
    return isinstance(m, (nn.Dropout, nn.Identity))


def from_sequential(seq):
    """``Sequential(Linear, act, [Dropout], Linear, [Dropout])`` -> ``FFNSpec``; None if not that shape."""
    items = list(seq.named_children())
    if not 3 <= len(items) <= 5 or not _is_linear(items[0][1]):
        return None
    names = [n for n, _ in items]
    mods = [m for _, m in items]
    i_down = next((i for i in (2, 3) if i < len(mods) and _is_linear(mods[i])), None)
    if i_down is None or any(True for _ in mods[1].parameters()) or any(not _dropout_like(m) for m in mods[2:i_down]) \
            or any(not isinstance(m, nn.Dropout) for m in mods[i_down + 1:]) or _own_state(seq):
        return None
    owners = dict(items)
    mid = names[2] if i_down == 3 else None
    post = names[i_down + 1] if i_down + 1 < len(mods) else None
    return build_spec("Sequential", owners, up=names[0], down=names[i_down], act_obj=mods[1],
                      mid_dropout=mid, post_dropout=post)


class _LeafTracer(torch.fx.Tracer):
    """Stops at every child: the structural match reads which children are called, not their insides."""

    def is_leaf_module(self, m, qualname):
        return True


def _traced_pattern(module):
    """Trace ``module.forward`` and match ``down([drop](act(up(x)) | act(gate(x)) * up(x)))[drop]``.

    Returns keyword arguments for ``build_spec`` or None when the forward is not exactly that."""
    graph = _LeafTracer().trace(module)
    nodes = list(graph.nodes)
    ph = [n for n in nodes if n.op == "placeholder"]
    out = [n for n in nodes if n.op == "output"]
    if len(ph) != 1 or len(out) != 1 or not isinstance(out[0].args[0], torch.fx.Node):
        return None
    x, used = ph[0], set(ph + out)

    def child(n):
        return getattr(module, n.target) if n.op == "call_module" and "." not in n.target else None

    def single(n):
        return isinstance(n, torch.fx.Node) and len(n.users) == 1 and not n.kwargs

    def linear_of(n):   # a linear child applied to x
        if isinstance(n, torch.fx.Node) and n.op == "call_module" and _is_linear(child(n)) \
                and n.args == (x,) and not n.kwargs:
            used.add(n)
            return n.target
        return None

    def act_of(n):      # an activation (a child, or a function) applied to one node
        if not isinstance(n, torch.fx.Node) or len(n.args) != 1 or len(n.users) != 1:
            return None
        if n.op == "call_module" and not n.kwargs and child(n) is not None and not _is_linear(child(n)):
            used.add(n)
            return n.args[0], child(n)
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
    if not (isinstance(h, torch.fx.Node) and h.op == "call_module" and _is_linear(child(h)) and single(h)
            and len(h.args) == 1):
        return None
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
            return None
    else:
        got = act_of(h)
        if not got or not linear_of(got[0]):
            return None
        spec.update(up=got[0].target, act_obj=got[1])
    if used != set(nodes):
        return None    # the forward does more than the FFN
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


def from_structure(module):
    """``FFNSpec`` of a module whose forward is an FFN of its children; None if it is not one."""
    if not _one_input(module):
        return None
    linears = [n for n, m in module.named_children() if _is_linear(m)]
    others = [m for m in module.children() if not _is_linear(m)]
    if not 2 <= len(linears) <= 3 or any(any(True for _ in m.parameters()) for m in others) or _own_state(module):
        return None
    try:
        found = _traced_pattern(module)
    except Exception:   # noqa: BLE001 - a forward FX cannot trace is simply not a recognised FFN
        return None
    if found is None:
        return None
    owners = dict(module.named_children())
    return build_spec(type(module).__name__, owners, **found)


# ---- one entry point ----------------------------------------------------------------------------------

def recognise(module, parent=None):
    """What ``module`` is: ``(kind, spec, linked)`` for a fusible FFN, ``(kind, Unsupported, None)`` for
    an FFN that cannot be fused, or None when it is not an FFN. ``linked`` is None, or for an FFN split
    over siblings (BERT) maps the owner name ``"down"`` to ``(sibling module, attribute name)`` of the
    down projection, which lives outside the module.

    Example:
        >>> from torch import nn
        >>> from fuser.recognize import recognise
        >>> kind, spec, linked = recognise(nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8)))
        >>> kind, spec.activation, spec.gated
        ('Sequential', 'silu', False)
    """
    key = _key(module)
    try:
        if key in KNOWN:
            return key[1], from_recipe(module, KNOWN[key]), None
        if key in PAIRS:
            recipe = PAIRS[key]
            sibling = getattr(parent, recipe.sibling, None) if parent is not None else None
            if sibling is None or _key(sibling) != recipe.sibling_kind:
                return None
            spec = from_pair(module, sibling, recipe)
            return f"{key[1]}+{recipe.sibling_kind[1]}", spec, {"down": (sibling, recipe.down)}
        if type(module) is nn.Sequential:
            spec = from_sequential(module)
            return (("Sequential", spec, None) if spec else None)
        spec = from_structure(module)
        return (type(module).__name__, spec, None) if spec else None
    except Unsupported as e:
        return key[1], e, None

"""Recognising FFNs in a module tree: what ``fuser.optimize`` swaps and ``fuser.report`` lists.

Three ways in, each a table or a pattern, never a guess:

- ``KNOWN``: known classes (Hugging Face, timm), keyed by (top-level package, class name), each mapped
  to a ``Recipe`` naming which child plays which role (gate, up, down, or one fused gate/up linear),
  where the activation lives, and which dropouts and norms sit where.
- ``PAIRS``: FFNs split over two sibling modules (BERT's ``intermediate`` + ``output``); only the
  GEMM -> activation -> GEMM part is fused, the dropout, residual and LayerNorm stay in the sibling.
- structure: ``nn.Sequential(Linear, act, [Dropout], Linear, [Dropout])``, and any other module whose
  ``forward`` traces (torch.fx, in eval mode, dropout functions that do nothing left out) to
  ``down(act(up(x)))`` or ``down(act(gate(x)) * up(x))``; traced in training mode too, to know whether
  it computes the same there (else the module's own forward runs in training: ``FFNSpec.train_source``).
  A module shaped like one (two or three projections) that does not match is a ``NearMiss``, whose
  message says what differs (a norm between the Linears, 1x1 convolutions, more than the FFN).

The activation is read from the module object (``ACT_CLASSES``, ``ACT_FUNCTIONS``): an activation, a
dtype, a layout or a feature fuser does not support makes the FFN a skip, with the reason. So do what a
swap would silently change: hooks on the FFN's modules (``check_hooks``), and linear layers that are not
plain ``nn.Linear`` ones (quantized, parametrized, subclasses; weights that are tensor subclasses).

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
from torch.nn.utils import parametrize

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


def _layout(m):
    """The ``LINEAR_CLASSES`` layout of `m`'s exact class, or None. torch.ao's quantized, QAT and reference
    linear layers are classes named ``Linear`` under torch too: of those only ``nn.Linear`` is plain."""
    key = _key(m)
    if key == ("torch", "Linear") and type(m) is not nn.Linear:
        return None
    return LINEAR_CLASSES.get(key)


def _not_plain(m):
    """What a linear layer fuser cannot read is, for the reason it gives."""
    cls = type(m)
    if parametrize.is_parametrized(m):
        names = ", ".join(m.parametrizations)
        return (f"a {cls.__mro__[1].__name__} with a parametrization of {names} (torch.nn.utils.parametrize; "
                "its weight is computed at every call)")
    if cls.__module__.startswith("torch.ao."):
        return f"{cls.__module__}.{cls.__name__}, a quantized linear layer"
    return f"{cls.__name__}, " + ("a subclass of nn.Linear (adapter, ...)" if isinstance(m, nn.Linear)
                                  else "not a linear layer")


def linear_layout(m, role):
    """'linear' or 'conv1d' for a linear layer fuser can read; raises ``Unsupported`` otherwise."""
    layout = _layout(m)
    if layout is None:
        raise Unsupported(f"{role} is {_not_plain(m)}; fuser reads plain nn.Linear weights")
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
    train_source: bool = False            # in training the replaced module's own forward runs: it differs
                                          # there (a dropout function, a branch on self.training)

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
    if d is not None and d.training and getattr(d, "p", 0) > 0:
        raise Unsupported(f"dropout {name!r} (p={d.p}) between the GEMMs is active in training mode; "
                          "call model.eval() first (or set p=0)")


def _plain(t, what):
    """Raise ``Unsupported`` unless `t` is a weight fuser can hand to a kernel as it is: a dense tensor (or
    Parameter) of torch's own class."""
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"{what} is a {type(t).__name__}, not a tensor")
    if type(t) not in (torch.Tensor, nn.Parameter):
        raise Unsupported(f"{what} is a {type(t).__name__}, a tensor subclass (quantized or sharded weights, say)")
    if t.layout is not torch.strided:
        raise Unsupported(f"{what} is {t.layout}, not a dense tensor")


#: the hooks torch calls around a module's forward and backward, by attribute
_HOOKS = (("_forward_pre_hooks", "forward pre-hook"), ("_forward_hooks", "forward hook"),
          ("_backward_pre_hooks", "backward pre-hook"), ("_backward_hooks", "backward hook"))


def check_hooks(modules):
    """Raise ``Unsupported`` naming the first hook found on `modules` (``(name, module)`` pairs, ``""``
    for the FFN itself): a FusedFFN computes the FFN without calling those modules, so their hooks would
    stop firing.

    Example:
        >>> from torch import nn
        >>> from fuser.recognize import Unsupported, check_hooks
        >>> lin = nn.Linear(4, 4)
        >>> _ = lin.register_forward_hook(lambda m, i, o: o * 2)
        >>> try:
        ...     check_hooks([("up", lin)])
        ... except Unsupported as e:
        ...     print(e)
        a forward hook on module 'up' would stop firing (fuser computes the FFN without calling its modules)
    """
    for name, m in modules:
        where = f"module {name!r}" if name else "the FFN module"
        for attr, what in _HOOKS:
            if getattr(m, attr, None):
                raise Unsupported(f"a {what} on {where} would stop firing (fuser computes the FFN without "
                                  "calling its modules)")
        if "forward" in m.__dict__:
            raise Unsupported(f"the forward of {where} is replaced on the instance (accelerate's offloading "
                              "hooks, say), and fuser would bypass it")


def _tensor_ok(t, what):
    if t.dtype not in DTYPES:
        raise Unsupported(f"{what} is {t.dtype}; fuser computes in bfloat16, float16 or float32")
    if t.device.type != "meta":
        if not t.is_contiguous():
            raise Unsupported(f"{what} is not contiguous")
        if t.data_ptr() % 16:
            raise Unsupported(f"{what} is not 16-byte aligned")


def build_spec(kind, owners, *, up, down, act_obj, gate=None, gate_up=None, gate_first=True,
               mid_dropout=None, post_dropout=None, linked=(), train_source=False):
    """Check the parts of one FFN and return its ``FFNSpec``; raises ``Unsupported`` with the reason.

    ``owners`` maps child names to modules; ``up``/``down``/``gate``/``gate_up`` name linear children;
    ``mid_dropout``/``post_dropout`` name dropout children (or are None); ``train_source`` says that in
    training mode the module's own forward computes something else (``FFNSpec.train_source``).

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
    for n in filter(None, roles.values()):
        _plain(getattr(owners[n], "weight", None), f"{n}.weight")
        if getattr(owners[n], "bias", None) is not None:
            _plain(owners[n].bias, f"{n}.bias")
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
                   linked=tuple(linked), train_source=train_source, **refs)


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
    for is_proj in (_is_linear, _is_conv1x1):
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
    1x1 convolutions around an activation."""
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
        miss = _own_state(seq) and f"the module holds tensors of its own ({', '.join(_own_state(seq))})"
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


def _traced_pattern(module, graph, is_proj=_is_linear):
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
    shaped like one; raises ``NearMiss`` when it is, and its forward differs from an FFN of them."""
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
    own = _own_state(module)
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


# ---- one entry point ----------------------------------------------------------------------------------

def recognise(module, parent=None):
    """What ``module`` is: ``(kind, spec, linked)`` for a fusible FFN, ``(kind, Unsupported, None)`` for
    an FFN that cannot be fused, ``(kind, NearMiss, None)`` for a module shaped like an FFN that is not
    one fuser matches, or None when it is not an FFN. ``linked`` is None, or for an FFN split over
    siblings (BERT) maps the owner name ``"down"`` to ``(sibling module, attribute name)`` of the down
    projection, which lives outside the module.

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
            spec = from_recipe(module, KNOWN[key])
            check_hooks(module.named_modules())
            return key[1], spec, None
        if key in PAIRS:
            recipe = PAIRS[key]
            sibling = getattr(parent, recipe.sibling, None) if parent is not None else None
            if sibling is None or _key(sibling) != recipe.sibling_kind:
                return None
            spec = from_pair(module, sibling, recipe)
            down = f"{recipe.sibling}.{recipe.down}"
            check_hooks([*module.named_modules(), (recipe.sibling, sibling), (down, getattr(sibling, recipe.down))])
            return f"{key[1]}+{recipe.sibling_kind[1]}", spec, {"down": (sibling, recipe.down)}
        spec = from_sequential(module) if type(module) is nn.Sequential else from_structure(module)
        if spec is None:
            return None
        check_hooks(module.named_modules())
        return ("Sequential" if type(module) is nn.Sequential else type(module).__name__), spec, None
    except (Unsupported, NearMiss) as e:
        return key[1], e, None

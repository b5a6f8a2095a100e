"""What a ``FusedFFN`` computes from, and whether a module's parts can be read that way.

An ``FFNSpec`` says where each weight of one FFN lives (owner child, parameter name, row range for a fused
gate/up weight), its activation and dimensions; ``build_spec`` checks the parts a recogniser
(fuser/recognize.py, fuser/structure.py) found and makes one, or raises ``Unsupported`` with the reason:
an activation, dtype, layout or feature fuser does not support, hooks that a swap would stop firing
(``check_hooks``), linear layers that are not plain ``nn.Linear`` ones (quantized, parametrized,
subclasses; weights that are tensor subclasses). Activations are read from the module object
(``ACT_CLASSES``, ``ACT_FUNCTIONS``), linear layers by exact class (``LINEAR_CLASSES``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["DTYPES", "Unsupported", "WeightRef", "FFNSpec", "ACT_CLASSES", "ACT_FUNCTIONS", "LINEAR_CLASSES",
           "activation_of", "linear_layout", "check_hooks", "build_spec"]

#: dtypes fuser computes in
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Unsupported(Exception):
    """An FFN was found but cannot be fused; the message says why."""


def class_key(obj):
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
        >>> from fuser.ffn_spec import activation_of
        >>> activation_of(nn.GELU(approximate="tanh"))
        'gelu_tanh'
    """
    if isinstance(obj, functools.partial) and obj.func is F.gelu and not obj.args \
            and set(obj.keywords) <= {"approximate"}:
        name = {"none": "gelu", "tanh": "gelu_tanh"}.get(obj.keywords.get("approximate", "none"))
        if name:
            return name
    if isinstance(obj, nn.Module):
        entry = ACT_CLASSES.get(class_key(obj))
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
    key = class_key(m)
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
    """'linear' or 'conv1d' for a linear layer fuser can read; raises ``Unsupported`` otherwise.

    Example:
        >>> from torch import nn
        >>> from fuser.ffn_spec import linear_layout
        >>> linear_layout(nn.Linear(4, 8), "up projection")
        'linear'
    """
    layout = _layout(m)
    if layout is None:
        raise Unsupported(f"{role} is {_not_plain(m)}; fuser reads plain nn.Linear weights")
    return layout


def is_linear(m):
    """Whether `m` is a linear layer by class (plain or not: ``linear_layout`` says if fuser reads it)."""
    return class_key(m) in LINEAR_CLASSES or isinstance(m, nn.Linear)


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


# ---- building and checking a spec --------------------------------------------------------------------
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
        >>> from fuser.ffn_spec import Unsupported, check_hooks
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
        >>> from fuser.ffn_spec import build_spec
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


def own_state(module):
    """Names of parameters/buffers a module holds itself (not through children): they would be lost."""
    return [n for n, _ in module.named_parameters(recurse=False)] + \
        [n for n, _ in module.named_buffers(recurse=False)]

"""fuser's functional ops. ``ffn`` validates every argument in C (through DLPack, so errors are the same
on every device) and runs the fused kernel where one applies, else the PyTorch reference."""
from __future__ import annotations

import contextlib
import os

import torch

from fuser import _C, runtime
from fuser.reference import ffn_reference

_TENSOR_ARGS = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "out")


#: torch's exporter behind ``Tensor.__dlpack__`` (absent in old torch): a capsule in ~0.2 us where the
#: Python method takes ~1.7 us. Equivalent here because fuser always names the tensor's current stream.
_to_capsule = getattr(torch._C, "_to_dlpack_versioned", None)


def _export(args):
    """What C takes in, and the mask of the positions holding capsules exported here: torch tensors go as
    capsules (or, where torch cannot export one that way, as detached views: torch's __dlpack__ refuses
    tensors that require grad), anything else as it is (C calls its __dlpack__, or says it is not a
    tensor; a caller's own raw capsule stays refused)."""
    objs, mask = [], 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if _to_capsule is not None:
                try:
                    objs.append(_to_capsule(a))
                    mask |= 1 << i
                    continue
                except Exception:  # noqa: BLE001 (C re-exports through __dlpack__ and names the argument)
                    pass
            a = a.detach()
        objs.append(a)
    return objs, mask


def _as_torch(obj):
    """A torch view of a validated argument (zero-copy for other DLPack producers)."""
    if obj is None or isinstance(obj, torch.Tensor):
        return obj
    return torch.from_dlpack(obj)


#: torch's current raw stream of a device (what Inductor's generated code calls): ~0.1 us where
#: ``torch.cuda.current_stream(d).cuda_stream`` builds a Stream object (~3 us)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
#: the current device's index without torch.cuda.current_device()'s Python (~3 us on a slow host)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
_NO_GUARD = contextlib.nullcontext()


def _placement(x):
    """(x's device index, the caller's current CUDA stream on it, a guard making that device current) for
    a CUDA torch tensor; (None, None, a no-op guard) for anything else. The guard switches devices only
    when x is not on the current one (torch.cuda.device costs ~2 us to enter and leave even when it
    need not)."""
    if isinstance(x, torch.Tensor) and x.is_cuda:
        dev = x.get_device()
        stream = _raw_stream(dev) if _raw_stream is not None else torch.cuda.current_stream(dev).cuda_stream
        return dev, stream, (_NO_GUARD if dev == _current_device() else torch.cuda.device(dev))
    return None, None, _NO_GUARD


_FUSED_DTYPES = (torch.bfloat16, torch.float16)


def _fused_plan(chain, tensors, plan):
    """The fused plan to run, or None to compute the reference (not CUDA, not 16-bit, autograd needed,
    no Hopper/NVRTC, or the planner predicts that fusing does not pay)."""
    x = tensors[0]
    if not isinstance(x, torch.Tensor) or not x.is_cuda or x.dtype not in _FUSED_DTYPES or chain["m"] == 0:
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    if disabled():
        return None
    device = chain["device_id"]
    if not runtime.fused_available(device)[0]:
        return None
    if plan is None:
        plan = runtime.plan_for(chain, device)
    return plan if plan.fused else None


def route(chain, x):
    """What ``fuser.ffn`` does with this validated chain whatever the call's autograd state: ``"reference"``
    (not CUDA, not 16-bit, no tokens, no fused path on x's device, or the planner's plan is unfused) or
    the fused :class:`fuser.Plan` it launches when no gradient is needed. ``FusedFFN`` remembers the
    answer per input shape so that later eager calls run PyTorch ops, or launch the plan, directly
    (see :func:`run_fused`) instead of validating and planning again (pure host overhead)."""
    if not x.is_cuda or x.dtype not in _FUSED_DTYPES or chain["m"] == 0:
        return "reference"
    device = x.get_device()
    if not runtime.fused_available(device)[0]:
        return "reference"
    plan = runtime.plan_for(chain, device)
    return plan if plan.fused else "reference"


# FUSER_DISABLE is read at every call (it may be set mid-session), from os.environ's own store: ~0.05 us
# where os.environ.get encodes and decodes (~0.5 us)
try:
    _ENV, _DISABLE_KEY = os.environ._data, os.environ.encodekey("FUSER_DISABLE")
    _NOT_DISABLED = (os.environ.encodevalue(""), os.environ.encodevalue("0"))
except AttributeError:  # not CPython's os._Environ
    _ENV = None


def disabled():
    """True when ``FUSER_DISABLE`` asks for the PyTorch reference everywhere."""
    if _ENV is not None:
        v = _ENV.get(_DISABLE_KEY)
        return v is not None and v not in _NOT_DISABLED
    return os.environ.get("FUSER_DISABLE", "") not in ("", "0")


def run_fused(plan, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out=None, exported=None,
              placement=None):
    """Launch fused `plan` on torch CUDA tensors and return the output (``out`` when given). The launch
    validates the tensors again in C against the kernel's chain, so a wrong tensor raises instead of
    running; the caller has checked the route (CUDA, 16-bit, no autograd, fused path available).
    ``exported``: the eight objects ``fuser.ffn`` exported for its check (capsules C only borrowed),
    launched as they are instead of exporting again; ``placement``: its ``_placement(x)``."""
    device, stream, guard = placement or _placement(x)
    y = out if out is not None else x.new_empty((*x.shape[:-1], w_down.shape[0]))
    if exported is None:
        objs, _ = _export((x, w_up, w_down, w_gate, b_up, b_gate, b_down, y))
    else:
        objs = list(exported)
        if out is None:
            objs[7] = _export((y,))[0][0]
    with guard:
        runtime.run(plan, objs, activation, device, x.numel() // x.shape[-1], stream)
    return y


def ffn(x, w_up, w_down, *, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="gelu", out=None,
        plan=None):
    """A transformer feed-forward block in one call.

    Computes ``act(x @ w_up.T + b_up) @ w_down.T + b_down``, or with ``w_gate`` the gated form
    ``(act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) @ w_down.T + b_down`` (SwiGLU with
    ``activation="silu"``, GeGLU with ``"gelu"``).

    Args:
        x: ``[..., d_model]``; leading dimensions are tokens (a 1-D ``x`` is one token).
        w_up, w_gate: ``[d_ff, d_model]``, the ``nn.Linear`` layout ``[out_features, in_features]``.
        w_down: ``[d_out, d_ff]``.
        b_up, b_gate: ``[d_ff]``; b_down: ``[d_out]``; all optional.
        activation: ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` or ``"silu"``.
        out: optional ``[..., d_out]`` tensor to write the result into (must not overlap an input).
        plan: optional :class:`fuser.Plan` for this chain to run instead of the planner's choice (a fused
            plan runs where the fused path is available; see ``fuser.env()``).

    All tensors share one dtype (bfloat16, float16 or float32) and one device, are contiguous and
    16-byte aligned. Bad arguments raise ``TypeError``/``ValueError`` naming the argument, what was
    expected and what was given.

    On a Hopper GPU, 16-bit CUDA tensors run one cluster-fused kernel when the planner predicts it pays
    (``fuser.plan`` explains the choice); elsewhere, for float32, or when gradients are needed, the
    PyTorch reference runs. ``FUSER_DISABLE=1`` forces the reference.

    Returns:
        ``[..., d_out]`` tensor (``out`` when given).

    Example:
        >>> import torch, fuser
        >>> x = torch.randn(2, 5, 64)
        >>> w_gate, w_up, w_down = torch.randn(172, 64), torch.randn(172, 64), torch.randn(64, 172)
        >>> fuser.ffn(x, w_up, w_down, w_gate=w_gate, activation="silu").shape
        torch.Size([2, 5, 64])
    """
    args = (x, w_up, w_down, w_gate, b_up, b_gate, b_down, out)
    placement = _placement(x)
    _, stream, guard = placement
    with guard:
        objs, mask = _export(args)
        chain = _C.ffn_check(*objs[:7], activation=activation, out=objs[7], stream=stream, capsules=mask)
    x, w_up, w_down, w_gate, b_up, b_gate, b_down, out = map(_as_torch, args)
    if plan is not None:
        _check_plan(plan, chain)
    fused = _fused_plan(chain, (x, w_up, w_down, w_gate, b_up, b_gate, b_down), plan)
    if fused is not None:
        return run_fused(fused, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, objs,
                         placement if x is args[0] else None)   # a torch x: its placement holds
    if out is not None and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w_up, w_down, w_gate, b_up, b_gate, b_down)):
        raise ValueError("out: out= does not support autograd (an input requires grad); "
                         "drop out= or run under torch.no_grad()")
    y = ffn_reference(x, w_up, w_down, w_gate=w_gate, b_up=b_up, b_gate=b_gate, b_down=b_down,
                      activation=activation)
    if out is not None:
        out.copy_(y)
        return out
    return y



def _check_plan(plan, chain):
    from fuser.planner import Plan
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    pc = plan.chain
    keys = ("d_model", "d_ff", "d_out", "gated", "activation", "bias_up", "bias_gate", "bias_down", "dtype")
    diff = [k for k in keys if pc[k] != chain[k]]
    if diff:
        raise ValueError("plan: it was made for a different FFN (" + ", ".join(f"{k} {pc[k]!r} vs {chain[k]!r}"
                                                                            for k in diff) + ")")

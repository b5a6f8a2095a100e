"""fuser's functional ops. ``ffn`` validates every argument in C (through DLPack, so errors are the same
on every device) and runs the fused kernel where one applies, else the PyTorch reference."""
from __future__ import annotations

import contextlib
import os

import torch

from fuser import _C
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


def _stream_of(x):
    """The caller's current CUDA stream for x's device (passed to __dlpack__), or None off CUDA."""
    if isinstance(x, torch.Tensor) and x.is_cuda:
        return torch.cuda.current_stream(x.device).cuda_stream
    return None


_FUSED_DTYPES = (torch.bfloat16, torch.float16)


def _fused_plan(chain, tensors, plan):
    """The fused plan to run, or None to compute the reference (not CUDA, not 16-bit, autograd needed,
    no Hopper/NVRTC, or the planner predicts that fusing does not pay)."""
    x = tensors[0]
    if not isinstance(x, torch.Tensor) or not x.is_cuda or x.dtype not in _FUSED_DTYPES or chain["m"] == 0:
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    if os.environ.get("FUSER_DISABLE", "") not in ("", "0"):
        return None
    from fuser import runtime
    device = chain["device_id"]
    if not runtime.fused_available(device)[0]:
        return None
    if plan is None:
        plan = runtime.plan_for(chain, device)
    return plan if plan.fused else None


def always_reference(chain, x):
    """True when ``fuser.ffn`` computes the PyTorch reference for this validated chain whatever the call's
    autograd state or environment: not CUDA, not 16-bit, no tokens, no fused path on x's device, or the
    planner's plan is unfused. ``FusedFFN`` remembers the answer per input shape so that, in eager mode,
    later calls run PyTorch ops directly instead of validating again (pure host overhead)."""
    if not x.is_cuda or x.dtype not in _FUSED_DTYPES or chain["m"] == 0:
        return True
    from fuser import runtime
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return not runtime.fused_available(device)[0] or not runtime.plan_for(chain, device).fused


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
    stream = _stream_of(x)
    device_guard = torch.cuda.device(x.device) if stream is not None else contextlib.nullcontext()
    with device_guard:
        objs, mask = _export(args)
        chain = _C.ffn_check(*objs[:7], activation=activation, out=objs[7], stream=stream, capsules=mask)
    x, w_up, w_down, w_gate, b_up, b_gate, b_down, out = map(_as_torch, args)
    if plan is not None:
        _check_plan(plan, chain)
    fused = _fused_plan(chain, (x, w_up, w_down, w_gate, b_up, b_gate, b_down), plan)
    if fused is not None:
        from fuser import runtime
        y = out if out is not None else torch.empty(*x.shape[:-1], w_down.shape[0], dtype=x.dtype, device=x.device)
        with device_guard:
            objs, _ = _export((x, w_up, w_down, w_gate, b_up, b_gate, b_down, y))
            if stream is None:  # x came from another DLPack producer
                stream = torch.cuda.current_stream(chain["device_id"]).cuda_stream
            runtime.run(fused, objs, activation, chain["device_id"], chain["m"], stream)
        return y
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

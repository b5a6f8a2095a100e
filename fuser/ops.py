"""``fuser.ffn``: one FFN call, validated in C and run on its route (``fuser.route``).

Every call is validated by the core through DLPack (the same errors on every device). A call of torch
tensors takes the short path: one capsule per tensor and one ``_C.ffn_key`` call, which validates them
and returns what the route depends on (the chain and the device); the route kept under that key runs.
The first call of a key, and a call with ``out=`` or ``plan=`` or with tensors of another DLPack
producer, takes the general path (``_C.ffn_check``, the route decided by ``fuser.route.route_for``).
"""
from __future__ import annotations

import torch

from fuser import _C, interop
from fuser.planner import Plan
from fuser.route import route_for
from fuser.target import default_target

__all__ = ["ffn", "route", "run_kept"]

_Tensor = torch.Tensor
_routes = {}                       # route key (_C.ffn_key) -> Route
_MAX_SIGNATURES = 4096
_ffn_key = _C.ffn_key
_ffn_kept = _C.ffn_kept
_linear = torch.nn.functional.linear
_keyed = interop.keyed             # whether _C.ffn_key takes torch tensors in this torch
_NAMES = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "out")
_SCALE_NAMES = ("x_scale", "up_scale", "gate_scale", "down_scale", "h_scale")   # (C's order)
_NOT_EXPORTABLE = (BufferError, RuntimeError, AssertionError)   # what torch raises for tensors it cannot share
_PLAN_KEYS = ("d_model", "d_ff", "d_out", "gated", "activation", "bias_up", "bias_gate", "bias_down", "dtype")


def _key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation):
    """The route key of a call of torch tensors (``_C.ffn_key``: validated in C), or None where the
    general path must judge the call (not a torch tensor, one torch cannot export, a bad argument: the
    general path raises what is wrong)."""
    try:
        return _ffn_key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
    except Exception:  # noqa: BLE001 (the general path says what is wrong)
        return None


def run_kept(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation):
    """This call's output by the route kept for its route key (its tensors validated in C, as ``route``
    validates them; ``_C.ffn_kept``: an eager route's ops run in that call), or None where ``route`` has to
    decide: the first call of the key, a stale route, or arguments the general path must judge (not
    contiguous, not torch tensors...). The operator's shortest path, and ``ffn``'s.

    Example:
        >>> import torch
        >>> from fuser import ops
        >>> x, w1, w2 = torch.randn(3, 24), torch.randn(40, 24), torch.randn(24, 40)
        >>> ops.run_kept(x, w1, w2, None, None, None, None, "relu") is None    # nothing kept for this chain yet
        True
        >>> r = ops.route(x, w1, w2, None, None, None, None, "relu")
        >>> torch.equal(ops.run_kept(x, w1, w2, None, None, None, None, "relu"), ffn(x, w1, w2, activation="relu"))
        True
    """
    return _ffn_kept(_routes, _linear, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation) if _keyed else None


def _exported(objs, names, bit0):
    """`objs` as ``_C.ffn_check`` takes them: torch tensors exported (``interop.export``), the rest as they
    are; and the mask of the capsules among them, bit ``bit0 + i`` for entry i. A torch tensor that torch
    cannot export (sparse, quantized, meta, nested, a wrapper without storage) is a TypeError naming it."""
    out, mask = [], 0
    for i, t in enumerate(objs):
        if isinstance(t, _Tensor):
            try:
                t = interop.export(t)
            except _NOT_EXPORTABLE as e:
                raise TypeError(f"{names[i]}: cannot be taken through DLPack ({type(e).__name__}: {e}); "
                                "pass a dense tensor") from e
            mask |= (1 << (bit0 + i)) if interop.to_capsule is not None else 0
        out.append(t)
    return out, mask


def _check(tensors, activation, out=None, scales=None):
    """Validate a call in C; returns the chain dict (``_C.ffn_check``). A torch tensor that torch cannot
    export (sparse, quantized, meta, nested, a wrapper without storage) is a TypeError naming it, as C
    reports for other producers. `scales`: a quantized chain's (x, up, gate, down, h)."""
    _, stream, guard = interop.placement(tensors[0])
    objs, mask = _exported((*tensors, out), _NAMES, 0)
    if scales is not None:   # (bits 8-12 of the mask: the scales)
        scales, smask = _exported(scales, _SCALE_NAMES, 8)
        mask |= smask
    with guard:
        return _C.ffn_check(*objs[:7], activation=activation, out=objs[7], stream=stream, capsules=mask,
                            scales=None if scales is None else tuple(scales))


def route(x, w_up, w_down, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="gelu", scales=None):
    """The route ``fuser.ffn`` takes for these arguments (a :class:`fuser.route.Route`), validated at
    every call and decided once per route key and kept (a quantized chain's, with its `scales`: once per
    chain). Raises what ``fuser.ffn`` raises for bad arguments.

    Example:
        >>> import torch
        >>> from fuser import ops
        >>> x, w1, w2 = torch.randn(3, 8), torch.randn(16, 8), torch.randn(8, 16)
        >>> r = ops.route(x, w1, w2, activation="relu")
        >>> r.fused, r is ops.route(x, w1, w2, activation="relu")
        (False, True)
    """
    tensors = (x, w_up, w_down, w_gate, b_up, b_gate, b_down)
    if scales is not None:
        return route_for(_check(tensors, activation, None, scale_tensors(scales)))
    key = _key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation) if _keyed else None
    r = _routes.get(key) if key is not None else None
    if r is None or r.stale:
        r = _remember(key, tensors, route_for(_check(tensors, activation)))
    return r


def scale_tensors(scales):
    """A :class:`fuser.fp8.Scales` as C takes them: (x, up, gate, down, h); anything else is a TypeError.

    Example:
        >>> import torch
        >>> from fuser import fp8, ops
        >>> s = fp8.quantize_ffn(torch.randn(16, 8), torch.randn(8, 16), x_samples=torch.randn(2, 8)).scales
        >>> ops.scale_tensors(s)[0] is s.x, ops.scale_tensors(s)[2] is None
        (True, True)
    """
    try:
        return (scales.x, scales.up, scales.gate, scales.down, scales.h)
    except AttributeError:
        raise TypeError(f"scales: expected a fuser.fp8.Scales (x, up, down, h, gate), got {type(scales).__name__}") \
            from None


def _remember(key, tensors, r):
    """Keep route `r` under route key `key` (None: nothing kept), a route whose graphs run the eager ops
    prepared for them; returns `r`."""
    if r.graphs_eager:
        r.prepare(tensors[1])
    if key is not None:
        if len(_routes) >= _MAX_SIGNATURES:
            _routes.clear()
        _routes[key] = r
    return r


def _as_torch(obj, name):
    """A torch view of a validated argument (zero-copy for other DLPack producers); one this torch
    cannot take (a CUDA tensor in a CPU-only build) is a ValueError naming it."""
    if obj is None or isinstance(obj, _Tensor):
        return obj
    try:
        return torch.from_dlpack(obj)
    except _NOT_EXPORTABLE as e:
        raise ValueError(f"{name}: this torch cannot take the tensor in ({type(e).__name__}: {e})") from e


def _check_plan(plan, chain):
    """Check `plan` for this call before anything is generated: made for this FFN, and valid on the GPU
    of x (``default_target()`` for its device; the target a plan carries is not trusted) for the
    call's tokens."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    pc = plan.raw.get("chain") if isinstance(plan.raw, dict) else None
    if isinstance(pc, dict):
        diff = [k for k in _PLAN_KEYS if pc.get(k) != chain[k]]
        if diff:
            raise ValueError("plan: it was made for a different FFN (" + ", ".join(
                f"{k} {pc.get(k)!r} vs {chain[k]!r}" for k in diff) + ")")
    if chain["device"] == "cuda":
        with torch.cuda.device(chain["device_id"]):
            target = default_target()
    else:
        target = default_target()
    plan.check(target, chain["m"])


def ffn(x, w_up, w_down, *, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="gelu", out=None,
        plan=None, scales=None):
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
        out: optional ``[..., d_out]`` tensor to write the result into (must not overlap an input); the eager
            route's down projection writes there itself where its GEMM can (no copy of the result).
        plan: optional :class:`fuser.Plan` for this chain to run instead of the planner's choice (a fused
            plan runs where the fused path is available; see ``fuser.env()``). It is checked first
            against the GPU of x and these tokens (:meth:`fuser.Plan.check`): a ValueError names the
            limit a plan breaks, before any code is generated.
        scales: a quantized FFN's :class:`fuser.fp8.Scales` (FP8, W8A8): then the weights are
            ``torch.float8_e4m3fn`` (``fuser.fp8.quantize_weight`` or ``fuser.fp8.quantize_ffn`` make them),
            ``x``, the biases and the result bfloat16, and the result is ``fuser.fp8.reference``'s: x is
            quantized with ``scales.x`` and H crosses between the GEMMs in e4m3 with ``scales.h``.

    All tensors share one dtype (bfloat16, float16 or float32) and one device, are contiguous and
    16-byte aligned. Bad arguments raise ``TypeError``/``ValueError`` naming the argument, what was
    expected and what was given.

    On a Hopper GPU, 16-bit CUDA tensors run one cluster-fused kernel when the planner predicts it pays
    (``fuser.plan`` explains the choice); elsewhere, for float32, or when gradients are needed, the
    PyTorch reference runs. ``FUSER_DISABLE=1`` forces the reference. Where the reference runs on a CUDA
    device without autograd, it takes fewer steps with the same or nearly the same values: a gated chain's
    activation and product as one kernel of fuser's (bitwise PyTorch's two ops); gate and up weights that are
    the two row halves of one tensor (``w[:d_ff]``, ``w[d_ff:]``) as one GEMM over it; a plain chain with
    ``b_up`` and ReLU or tanh GELU with the activation in the GEMM's epilogue (one rounding fewer; without
    ``b_up`` over a zero bias, from ``fuser.runtime.ZERO_BIAS_MIN_TOKENS`` tokens where that is on); any other plain
    chain with its activation in place of the up projection's result (the same bits, one allocation fewer).

    Returns:
        ``[..., d_out]`` tensor (``out`` when given).

    Example:
        >>> import torch, fuser
        >>> x = torch.randn(2, 5, 64)
        >>> w_gate, w_up, w_down = torch.randn(172, 64), torch.randn(172, 64), torch.randn(64, 172)
        >>> fuser.ffn(x, w_up, w_down, w_gate=w_gate, activation="silu").shape
        torch.Size([2, 5, 64])
    """
    key = None
    if scales is not None:   # a quantized chain: validated in C with its scales at every call
        st = scale_tensors(scales)
        if out is None and plan is None and _keyed:
            try:
                key = _ffn_key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, st)
            except Exception:  # noqa: BLE001 (the general path says what is wrong)
                pass
            r = _routes.get(key)
            if r is not None and not r.stale:
                return r.run(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, None, st)
        return _quantized(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, plan, st, key)
    if plan is None and _keyed:
        # run_kept, inline: this is every call's path (the key, the kept route and an eager route's ops in C;
        # out validated there with the rest)
        y = _ffn_kept(_routes, _linear, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out)
        if y is not None:
            return y
        key = _key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
    # the first call of its route key, or one with plan=, a bad argument or tensors of another DLPack producer
    tensors = (x, w_up, w_down, w_gate, b_up, b_gate, b_down)
    chain = _check(tensors, activation, out)
    if plan is not None:
        _check_plan(plan, chain)
    if isinstance(out, _Tensor) and out.requires_grad and torch.is_grad_enabled():
        raise ValueError("out: it requires grad, and autograd cannot record a result written into it; pass "
                         "a tensor that does not require grad, or call under torch.no_grad()")
    r = _remember(key, tensors, route_for(chain, plan))
    args = [_as_torch(t, name) for t, name in zip((*tensors, out), _NAMES)]
    return r.run(*args[:7], activation, args[7])


def _quantized(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, plan, scales, key=None):
    """``ffn`` for a quantized chain's call that no kept route served (`scales`: C's order, x, up, gate, down,
    h): validated in C with its scales, its route kept under route key `key` (None: not kept)."""
    tensors = (x, w_up, w_down, w_gate, b_up, b_gate, b_down)
    chain = _check(tensors, activation, out, scales)
    if plan is not None:
        _check_plan(plan, chain)
    r = _remember(key, tensors, route_for(chain, plan))
    args = [_as_torch(t, name) for t, name in zip((*tensors, out), _NAMES)]
    return r.run(*args[:7], activation, args[7], tuple(_as_torch(t, "scales") for t in scales))

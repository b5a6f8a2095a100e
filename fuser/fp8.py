"""FP8 (W8A8) FFNs: quantization helpers, the exact meaning of the fused FP8 kernel, and PyTorch's own FP8
path as the baseline it is timed against.

The recipe is static per-tensor activation scales with per-output-channel weight scales, all in e4m3
(``torch.float8_e4m3fn``: round to nearest even, saturating at +-448 here)::

    x_q = e4m3(x / s_x)                       s_x: one fp32 scale, calibrated on sample activations
    w_q = e4m3(w / s_w[:, None])              s_w: one fp32 scale per row (output channel) of w
    U   = (x_q @ w_up_q.T) * (s_x * s_up) + b_up          (G likewise with w_gate, s_gate, b_gate)
    H   = act(G) * U   (gated)   or   act(U)   (plain)
    H_q = e4m3(H / s_h)                       s_h: one fp32 scale, calibrated on sample hidden activations
    y   = (H_q @ w_down_q.T) * (s_h * s_down) + b_down    returned as bfloat16

Divisions by a per-tensor scale are multiplications by its fp32 reciprocal, as the kernel does them.

    >>> import torch
    >>> from fuser import fp8
    >>> w_up, w_down = torch.randn(256, 64) * 0.02, torch.randn(64, 256) * 0.02
    >>> x = torch.randn(4, 64)
    >>> q = fp8.quantize_ffn(w_up, w_down, x_samples=x, activation="gelu")
    >>> y = fp8.reference(fp8.quantize(x, q.scales.x), q.w_up, q.w_down, q.scales, activation="gelu")
    >>> y.shape, y.dtype
    (torch.Size([4, 64]), torch.bfloat16)

``reference`` is what the fused kernel is held to (it runs on any device, in fp32); ``torch_path`` is the
same FFN built from ``torch._scaled_mm`` and elementwise PyTorch ops, on CUDA only.
"""
from __future__ import annotations

import math
import typing

import torch

from fuser import _C
from fuser.reference import ACTIVATIONS

__all__ = ["E4M3_MAX", "SCALED_MM_RECIPES", "ROWWISE_TOKENS", "Scales", "QuantizedFFN", "e4m3", "quantize_weight",
           "quantize", "activation_scale", "reference", "eager_recipe", "eager", "quantize_ffn", "torch_path"]

#: the largest finite float8_e4m3fn value; quantization saturates there
E4M3_MAX = 448.0

_FP8 = torch.float8_e4m3fn
_BIAS_DTYPES = (torch.bfloat16, torch.float16)

#: how ``torch_path`` calls ``torch._scaled_mm``, settled by its first call on each device (see
#: ``torch_path``): (device, whether the token count is a multiple of 16, the recipe asked for: None,
#: "tensorwise" or "rowwise") -> (the recipe used, "tensorwise" or "rowwise"; the rows padded to, 1 or 16)
SCALED_MM_RECIPES = {}
#: At whole multiples of this many tokens (and from 512 on) ``eager`` runs rowwise ``_scaled_mm`` GEMMs
#: (the core's constant, which the planner's cost model uses too; ``eager_recipe``).
ROWWISE_TOKENS = _C.FP8_ROWWISE_TOKENS
_ONES = {}   # device -> a 1.0 fp32 scalar there (tensorwise scale_b)


class Scales(typing.NamedTuple):
    """The fp32 scales of an FP8 FFN: ``x`` and ``h`` one element each (shape ``[]`` or ``[1]``), ``up`` and
    ``gate`` ``[d_ff]`` (one per row of ``w_up``/``w_gate``), ``down`` ``[d_out]``; ``gate`` only for a
    gated FFN.

    Example:
        >>> import torch
        >>> from fuser.fp8 import Scales
        >>> s = Scales(x=torch.ones(1), up=torch.ones(8), down=torch.ones(4), h=torch.ones(1))
        >>> s.gate is None
        True
    """
    x: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    h: torch.Tensor
    gate: typing.Optional[torch.Tensor] = None


class QuantizedFFN(typing.NamedTuple):
    """An FFN's weights in e4m3 with their scales, as ``quantize_ffn`` returns them (``w_gate`` None for a
    plain FFN).

    Example:
        >>> import torch
        >>> from fuser.fp8 import quantize_ffn
        >>> q = quantize_ffn(torch.randn(32, 16), torch.randn(16, 32), x_samples=torch.randn(8, 16))
        >>> q.w_up.dtype, q.w_gate, q.scales.up.shape
        (torch.float8_e4m3fn, None, torch.Size([32]))
    """
    w_up: torch.Tensor
    w_down: torch.Tensor
    scales: Scales
    w_gate: typing.Optional[torch.Tensor] = None


def e4m3(t):
    """``t`` rounded to float8_e4m3fn: computed in fp32, round to nearest even, saturating to +-448 (a
    plain cast would turn values past 448 into NaN); NaN stays NaN.

    Example:
        >>> import torch
        >>> from fuser.fp8 import e4m3
        >>> e4m3(torch.tensor([1.0, 1.0625, 1.1875, 1.2, 500.0, -1e9])).float().tolist()
        [1.0, 1.0, 1.25, 1.25, 448.0, -448.0]
    """
    return t.float().clamp(-E4M3_MAX, E4M3_MAX).to(_FP8)


def _check_float_tensor(t, name, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor ({what}), got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor ({what}), got {t.dtype}")


def _check_finite(t, name, hint):
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: holds NaN or infinite values; {hint}")


def _safe_scale(amax):
    """amax / 448 where that is a positive finite fp32 number, else 1.0 (an all-zero row or tensor, or one
    so small that the division underflows)."""
    s = amax.float() / E4M3_MAX
    return torch.where(s > 0, s, torch.ones_like(s))


def quantize_weight(w):
    """A weight matrix in e4m3 with one fp32 scale per row (output channel): ``(w_q, scale)``.

    ``scale[r] = max(|w[r]|) / 448`` (1.0 for a row of zeros), ``w_q = e4m3(w / scale[:, None])`` computed in
    fp32, so each row's largest value maps to +-448 and ``w_q.float() * scale[:, None]`` approximates ``w``
    to within 2^-4 relative per element (e4m3 keeps 3 mantissa bits), away from the subnormal range.

    Args:
        w: ``[rows, cols]`` floating-point tensor (``nn.Linear`` layout: rows are output channels), finite.

    Returns:
        ``w_q`` (``[rows, cols]`` float8_e4m3fn) and ``scale`` (``[rows]`` float32), on w's device; neither
        requires grad.

    Example:
        >>> import torch
        >>> from fuser.fp8 import quantize_weight
        >>> w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
        >>> w_q, scale = quantize_weight(w)
        >>> w_q.dtype, scale.tolist()
        (torch.float8_e4m3fn, [0.004464285913854837, 1.0])
        >>> (w_q.float() * scale[:, None]).tolist()
        [[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]]
    """
    return _quantize_weight(w, "w")


def _quantize_weight(w, name):
    _check_float_tensor(w, name, "a [rows, cols] weight matrix")
    if w.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D [rows, cols] weight matrix, got shape {list(w.shape)}; pass each "
                         "weight matrix separately in the nn.Linear layout [out_features, in_features]")
    if w.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty matrix, got shape {list(w.shape)}")
    wf = w.detach().float()   # (a constant: never part of an autograd graph, so it can be taken through DLPack)
    _check_finite(wf, name, "pass a finite weight matrix")
    scale = _safe_scale(wf.abs().amax(dim=1))
    return e4m3(wf / scale[:, None]), scale


def _as_scale(scale, name):
    """A per-tensor scale as a 0-dim fp32 tensor (a Python number is checked to be positive and finite)."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"{name}: expected a positive finite scale, got {scale!r}")
        return torch.tensor(float(scale), dtype=torch.float32)
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 tensor of one element or a Python float, got "
                        f"{type(scale).__name__}")
    if scale.numel() != 1:
        raise ValueError(f"{name}: expected one per-tensor scale (shape [] or [1]), got shape {list(scale.shape)}; "
                         "make one with fuser.fp8.activation_scale")
    return scale.float().reshape(())


def quantize(t, scale):
    """``t`` quantized to e4m3 with a static per-tensor scale: ``e4m3(t.float() * (1 / scale))``, the
    reciprocal taken in fp32 (``torch.reciprocal``) as the fused kernel takes it.

    Args:
        t: floating-point tensor of any shape (activations, e.g. bfloat16 ``[tokens, d_model]``).
        scale: fp32 tensor of one element (shape ``[]`` or ``[1]``, on t's device or a CPU scalar), or a
            positive Python float; ``activation_scale`` makes one.

    Returns:
        float8_e4m3fn tensor of t's shape.

    Example:
        >>> import torch
        >>> from fuser.fp8 import quantize
        >>> quantize(torch.tensor([0.5, -1.0, 1000.0]), torch.tensor([0.25])).float().tolist()
        [2.0, -4.0, 448.0]
        >>> quantize(torch.tensor([3.0]), 2.0).float().tolist()
        [1.5]
    """
    _check_float_tensor(t, "t", "the values to quantize")
    r = torch.reciprocal(_as_scale(scale, "scale"))
    if t.dim():
        # a [1, ..., 1] factor: the product is computed and kept in fp32 whatever t's dtype (a 0-dim
        # factor would leave a bfloat16 t's product in bfloat16), in one elementwise kernel
        return (t * r.reshape([1] * t.dim()).to(t.device)).clamp_(-E4M3_MAX, E4M3_MAX).to(_FP8)
    return e4m3(t.float() * r.to(t.device))


def activation_scale(samples):
    """A static per-tensor scale calibrated on sample activations: ``max(|samples|) / 448`` as a float32
    tensor of shape ``[1]`` on the samples' device (1.0 when every sample is zero).

    Example:
        >>> import torch
        >>> from fuser.fp8 import activation_scale
        >>> activation_scale(torch.tensor([[1.0, -896.0], [3.0, 4.0]])).tolist()
        [2.0]
    """
    _check_float_tensor(samples, "samples", "sample activations")
    if samples.numel() == 0:
        raise ValueError("samples: expected at least one sample activation, got an empty tensor")
    amax = samples.detach().float().abs().amax()
    if not bool(torch.isfinite(amax)):
        raise ValueError("samples: holds NaN or infinite values; calibrate on finite activations")
    return _safe_scale(amax).reshape(1)


def _activation(activation):
    act = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if act is None:
        raise ValueError(f"activation: unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    return act


def _as_quantized(x, scales):
    """x as the kernel multiplies it: float8_e4m3fn as given, else ``quantize(x, scales.x)``."""
    if isinstance(x, torch.Tensor) and x.dtype != _FP8:
        _check_float_tensor(x, "x_q", "x in a floating-point dtype, or quantized")
        if not isinstance(scales, Scales) and not hasattr(scales, "x"):
            raise TypeError(f"scales: expected a fuser.fp8.Scales, got {type(scales).__name__}")
        return quantize(x, scales.x)
    _check_fp8(x, "x_q", "[..., d_model]", "quantize it with fuser.fp8.quantize(x, scales.x)")
    return x


def _check_fp8(t, name, shape_doc, hint):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {shape_doc}, got {type(t).__name__}")
    if t.dtype != _FP8:
        raise TypeError(f"{name}: expected torch.float8_e4m3fn, got {t.dtype}; {hint}")


def _check_vector(t, name, length, what, dtypes, device, hint, xname):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor of shape [{length}] ({what}), got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected {' or '.join(map(str, dtypes))}, got {t.dtype}; {hint}")
    if tuple(t.shape) != (length,):
        raise ValueError(f"{name}: expected shape [{length}] ({what}), got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, but {xname} is on {device}; move it to {device}")


def _check_per_tensor(t, name, device, xname):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 tensor of one element, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected torch.float32, got {t.dtype}; make it with fuser.fp8.activation_scale")
    if t.numel() != 1 or t.dim() > 1:
        raise ValueError(f"{name}: expected one per-tensor scale (shape [] or [1]), got shape {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, but {xname} is on {device}; move it to {device}")


def _check_ffn(xname, d_model, device, w_up, w_down, scales, w_gate, b_up, b_gate, b_down):
    """Checks the FFN's weights, scales and biases against the activations `xname` (their last dimension
    d_model, their device); returns d_out."""
    hint = "quantize it with fuser.fp8.quantize_weight"
    for t, name, doc in ((w_up, "w_up", "[d_ff, d_model]"), (w_down, "w_down", "[d_out, d_ff]"),
                         (w_gate, "w_gate", "[d_ff, d_model]")):
        if t is None and name == "w_gate":
            continue
        _check_fp8(t, name, doc, hint)
        if t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D {doc} matrix, got shape {list(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, but {xname} is on {device}; move it to {device}")
    d_ff = w_up.shape[0]
    if w_up.shape[1] != d_model:
        raise ValueError(f"w_up: expected shape [d_ff, {d_model}] (d_model = {xname}.shape[-1]), got "
                         f"{list(w_up.shape)}")
    if w_gate is not None and tuple(w_gate.shape) != tuple(w_up.shape):
        raise ValueError(f"w_gate: expected the shape of w_up, {list(w_up.shape)}, got {list(w_gate.shape)}")
    if w_down.shape[1] != d_ff:
        raise ValueError(f"w_down: expected shape [d_out, {d_ff}] (d_ff = w_up.shape[0] = {d_ff}), got "
                         f"{list(w_down.shape)}")
    d_out = w_down.shape[0]
    if not isinstance(scales, Scales):
        raise TypeError(f"scales: expected a fuser.fp8.Scales, got {type(scales).__name__}")
    _check_per_tensor(scales.x, "scales.x", device, xname)
    _check_per_tensor(scales.h, "scales.h", device, xname)
    f32 = (torch.float32,)
    whint = "use the scale that fuser.fp8.quantize_weight returned"
    _check_vector(scales.up, "scales.up", d_ff, "one scale per row of w_up", f32, device, whint, xname)
    _check_vector(scales.down, "scales.down", d_out, "one scale per row of w_down", f32, device, whint, xname)
    if w_gate is not None:
        if scales.gate is None:
            raise ValueError("scales.gate: w_gate is given, so its per-row scales are needed: "
                             "Scales(..., gate=<the scale fuser.fp8.quantize_weight returned for w_gate>)")
        _check_vector(scales.gate, "scales.gate", d_ff, "one scale per row of w_gate", f32, device, whint, xname)
    elif scales.gate is not None:
        raise ValueError("scales.gate: given for a plain FFN; pass w_gate too, or leave scales.gate None")
    if b_gate is not None and w_gate is None:
        raise ValueError("b_gate: given for a plain FFN (no w_gate); pass w_gate too, or leave b_gate out")
    bhint = "biases are bfloat16 or float16"
    for t, name, n in ((b_up, "b_up", d_ff), (b_gate, "b_gate", d_ff), (b_down, "b_down", d_out)):
        if t is not None:
            _check_vector(t, name, n, "one bias per output", _BIAS_DTYPES, device, bhint, xname)
    return d_out


def _hidden(a, w_up, w_gate, s_x, s_up, s_gate, b_up, b_gate, act):
    """H in fp32 from the dequantized rows ``a`` ([M, d_model] fp32): the first half of the kernel."""
    u = (a @ w_up.float().T) * (s_x * s_up)
    if b_up is not None:
        u = u + b_up.float()
    if w_gate is None:
        return act(u)
    g = (a @ w_gate.float().T) * (s_x * s_gate)
    if b_gate is not None:
        g = g + b_gate.float()
    return act(g) * u


def reference(x_q, w_up, w_down, scales, *, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="silu"):
    """What the fused FP8 FFN kernel computes, in fp32 PyTorch ops on x_q's device (the module docstring's
    formulas): x quantized with ``scales.x`` (unless it already is), the GEMMs of e4m3 values in fp32, the
    per-row scales applied to each GEMM's result, the bias added after them, H rounded to e4m3 with
    ``scales.h``, the result rounded to bfloat16.

    Every e4m3 value and every product of two is exact in fp32 (and in TF32), so the GEMMs differ from the
    kernel's only in how their fp32 sums are ordered and rounded; where that shows most is H's rounding to
    e4m3, where a value near a rounding boundary may land one e4m3 step away.

    Args:
        x_q: ``[..., d_model]``: x in a floating-point dtype (``fuser.ffn`` takes bfloat16), quantized here as
            the kernel quantizes it, ``quantize(x, scales.x)``; or that already, in float8_e4m3fn.
        w_up, w_gate: float8_e4m3fn ``[d_ff, d_model]``; ``w_gate`` makes the FFN gated.
        w_down: float8_e4m3fn ``[d_out, d_ff]``.
        scales: ``Scales``, float32 tensors on x_q's device.
        b_up, b_gate: ``[d_ff]``; b_down: ``[d_out]``; bfloat16 or float16, optional.
        activation: ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"silu"``.

    Returns:
        bfloat16 ``[..., d_out]``.

    Example:
        >>> import torch
        >>> from fuser import fp8
        >>> w_up, w_gate, w_down = (torch.randn(s) * 0.05 for s in ((96, 32), (96, 32), (32, 96)))
        >>> x = torch.randn(3, 32)
        >>> q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=x, activation="silu")
        >>> y = fp8.reference(fp8.quantize(x, q.scales.x), q.w_up, q.w_down, q.scales, w_gate=q.w_gate)
        >>> y.shape, torch.equal(y, fp8.reference(x, q.w_up, q.w_down, q.scales, w_gate=q.w_gate))
        (torch.Size([3, 32]), True)
    """
    x_q = _as_quantized(x_q, scales)
    if x_q.dim() == 0:
        raise ValueError("x_q: expected shape [..., d_model], got a 0-dim tensor")
    d_out = _check_ffn("x_q", x_q.shape[-1], x_q.device, w_up, w_down, scales, w_gate, b_up, b_gate, b_down)
    act = _activation(activation)
    lead = x_q.shape[:-1]
    a = x_q.reshape(-1, x_q.shape[-1]).float()
    s_x, s_h = scales.x.float().reshape(()), scales.h.float().reshape(())
    h = _hidden(a, w_up, w_gate, s_x, scales.up, scales.gate, b_up, b_gate, act)
    h_q = e4m3(h * torch.reciprocal(s_h))
    y = (h_q.float() @ w_down.float().T) * (s_h * scales.down)
    if b_down is not None:
        y = y + b_down.float()
    return y.to(torch.bfloat16).reshape(*lead, d_out)


def quantize_ffn(w_up, w_down, *, w_gate=None, b_up=None, b_gate=None, x_samples, activation="silu"):
    """An FFN's weights quantized (``quantize_weight``) and its activation scales calibrated on
    ``x_samples``: ``scales.x`` from the samples, ``scales.h`` from the hidden activations H that the FP8
    FFN computes for them (the samples quantized, as the kernel would see them).

    Args:
        w_up, w_gate: ``[d_ff, d_model]`` floating-point weights; ``w_gate`` makes the FFN gated.
        w_down: ``[d_out, d_ff]``.
        b_up, b_gate: optional ``[d_ff]`` biases (any float dtype), used only to calibrate ``scales.h``.
        x_samples: ``[..., d_model]`` sample activations (e.g. a batch of real inputs to this FFN).
        activation: the FFN's activation, used to calibrate ``scales.h``.

    Returns:
        ``QuantizedFFN(w_up, w_down, scales, w_gate)``, weights in float8_e4m3fn. They are constants: none
        requires grad, so an ``nn.Linear``'s Parameters may be passed as they are.

    Example:
        >>> import torch
        >>> from fuser.fp8 import quantize_ffn
        >>> q = quantize_ffn(torch.randn(64, 16), torch.randn(16, 64), w_gate=torch.randn(64, 16),
        ...                  x_samples=torch.randn(10, 16))
        >>> q.scales.x.shape, q.scales.h.shape, q.scales.gate.shape, q.scales.down.shape
        (torch.Size([1]), torch.Size([1]), torch.Size([64]), torch.Size([16]))
    """
    act = _activation(activation)
    wu, su = _quantize_weight(w_up, "w_up")
    wd, sd = _quantize_weight(w_down, "w_down")
    wg, sg = (None, None) if w_gate is None else _quantize_weight(w_gate, "w_gate")
    if tuple(wd.shape[1:]) != tuple(wu.shape[:1]) or (wg is not None and wg.shape != wu.shape):
        raise ValueError(f"w_up, w_gate, w_down: expected [d_ff, d_model], [d_ff, d_model], [d_out, d_ff], got "
                         f"{list(wu.shape)}, {None if wg is None else list(wg.shape)}, {list(wd.shape)}")
    _check_float_tensor(x_samples, "x_samples", "sample activations")
    if x_samples.shape[-1:] != w_up.shape[1:]:
        raise ValueError(f"x_samples: expected shape [..., {w_up.shape[1]}] (d_model = w_up.shape[1]), got "
                         f"{list(x_samples.shape)}")
    with torch.no_grad():   # (constants, as the weights' scales: whatever requires grad among the inputs)
        s_x = activation_scale(x_samples)
        a = quantize(x_samples, s_x).reshape(-1, w_up.shape[1]).float()
        h = _hidden(a, wu, wg, s_x.reshape(()), su, sg, b_up, b_gate, act)
        s_h = activation_scale(h)
    return QuantizedFFN(wu, wd, Scales(x=s_x, up=su, down=sd, h=s_h, gate=sg), wg)


def _one(device):
    """A 1.0 fp32 scalar on `device`, made once (no fill kernel per GEMM, and none made inside graph capture
    once the first eager call has run)."""
    one = _ONES.get(device)
    if one is None:
        one = _ONES[device] = torch.ones((), dtype=torch.float32, device=device)
    return one


def _scaled_mm(a, w_q, s_a, s_w, recipe):
    """bf16 ``[M, N]`` = (a @ w_q.T) * s_a * s_w[None, :] from e4m3 a [M, K] (row-major) and w_q [N, K],
    s_w fp32 [N]; s_a as ``_a_scale`` made it for the recipe. ``w_q.t()`` is the column-major [K, N]
    operand _scaled_mm takes."""
    if recipe == "rowwise":
        return torch._scaled_mm(a, w_q.t(), scale_a=s_a, scale_b=s_w.reshape(1, -1), out_dtype=torch.bfloat16)
    # tensorwise: the per-tensor scale in the GEMM, the per-row weight scales applied to its bf16 result (an
    # in-place bf16 * fp32 product is computed in fp32, then rounded to bf16)
    return torch._scaled_mm(a, w_q.t(), scale_a=s_a, scale_b=_one(a.device), out_dtype=torch.bfloat16).mul_(s_w)


def _a_scale(s, rows, recipe):
    """A per-tensor scale as the recipe's scale_a: 0-dim (tensorwise), or [rows, 1] contiguous fp32 filled
    with it (rowwise; an expanded view is not contiguous, which _scaled_mm requires)."""
    s = s.reshape(())
    return s.reshape(1, 1).expand(rows, 1).contiguous() if recipe == "rowwise" else s


def eager_recipe(tokens):
    """The ``_scaled_mm`` recipe ``eager`` runs at `tokens` tokens, as the planner prices it: "rowwise" (the
    per-row scales inside the GEMM) at whole multiples of ``ROWWISE_TOKENS`` and from 512 tokens on, else
    "tensorwise" (the weight scales applied by one more op). On the H200 rowwise GEMMs are the faster at
    128, 256 and 384 tokens, up to 1.6x slower in between (144, 160, 320) and below 128, and the faster
    from 512 on whatever the count (576, 1000, 2000: benchmarks/RESULTS.md).

    Example:
        >>> from fuser import fp8
        >>> [fp8.eager_recipe(m) for m in (1, 127, 128, 160, 256, 320, 1000)]
        ['tensorwise', 'tensorwise', 'rowwise', 'tensorwise', 'rowwise', 'tensorwise', 'rowwise']
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise TypeError(f"tokens: expected an integer token count, got {type(tokens).__name__} {tokens!r}")
    if tokens < 0:
        raise ValueError(f"tokens: expected a token count of 0 or more, got {tokens}")
    return "rowwise" if _C.fp8_rowwise(min(tokens, 1 << 62)) else "tensorwise"   # (beyond int64: as large)


def eager(x_q, w_up, w_down, scales, *, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="silu"):
    """A quantized FFN in PyTorch's ops, as ``fuser.ffn`` runs it where the planner prefers them to the fused
    kernel: x quantized with ``scales.x`` (unless it already is, in float8_e4m3fn), then on CUDA
    ``torch._scaled_mm`` GEMMs with bfloat16 results, the biases added and the elementwise kernels run in
    bfloat16 (a gated chain's activation and product as fuser's gate kernel where it runs: the same bits),
    H quantized with ``scales.h``; ``reference`` elsewhere, and where ``_scaled_mm`` refuses the
    shapes (dimensions not multiples of 16). The GEMMs are rowwise (the scales inside the GEMM) at whole
    multiples of ``ROWWISE_TOKENS`` tokens and from 512 on, tensorwise elsewhere (the per-row weight scales
    applied to their results by one more op each): ``eager_recipe``, the faster of the two on the H200 at
    each token count measured (benchmarks/RESULTS.md), and how the planner prices them. The intermediates
    are bfloat16 where the kernel keeps fp32, so the result is close to ``reference``'s, not equal.

    Example:
        >>> import torch
        >>> from fuser import fp8
        >>> q = fp8.quantize_ffn(torch.randn(32, 16), torch.randn(16, 32), x_samples=torch.randn(4, 16))
        >>> x_q = fp8.quantize(torch.randn(4, 16), q.scales.x)
        >>> torch.equal(fp8.eager(x_q, q.w_up, q.w_down, q.scales, activation="gelu"),
        ...             fp8.reference(x_q, q.w_up, q.w_down, q.scales, activation="gelu"))   # (on CPU)
        True
    """
    kw = dict(w_gate=w_gate, b_up=b_up, b_gate=b_gate, b_down=b_down, activation=activation)
    if x_q.device.type != "cuda" or x_q.dim() == 0 or x_q.shape[-1] % 16:
        return reference(x_q, w_up, w_down, scales, **kw)
    x_q = _as_quantized(x_q, scales)
    d_out = _check_ffn("x_q", x_q.shape[-1], x_q.device, w_up, w_down, scales, w_gate, b_up, b_gate, b_down)
    act = _activation(activation)
    lead, a = x_q.shape[:-1], x_q.reshape(-1, x_q.shape[-1])
    recipe = eager_recipe(a.shape[0])
    h_scale = scales.h.float().reshape(())
    s_x, s_h = _a_scale(scales.x.float(), a.shape[0], recipe), _a_scale(h_scale, a.shape[0], recipe)

    def linear(t, w, s_a, s_w, b):
        y = _scaled_mm(t, w, s_a, s_w, recipe)
        return y if b is None else y.add_(b)
    try:
        u = linear(a, w_up, s_x, scales.up, b_up)
        if w_gate is None:
            h = act(u)
        else:   # act(g) * u in bfloat16: fuser's gate kernel in place of g where it runs (the same bits), else the ops
            h = linear(a, w_gate, s_x, scales.gate, b_gate)
            if not _C.gate(h, u, act):
                h = act(h) * u
        y = linear(quantize(h, h_scale), w_down, s_h, scales.down, b_down)
    except RuntimeError:   # shapes or a torch build _scaled_mm does not take
        return reference(x_q, w_up, w_down, scales, **kw)
    return y.reshape(*lead, d_out)


def _torch_path_once(x, w_up_q, w_down_q, scales, w_gate, act, recipe, rows):
    m = x.shape[0]
    if rows > 1 and m % rows:
        x = torch.nn.functional.pad(x, (0, 0, 0, rows - m % rows))
    s_x, s_h = _a_scale(scales.x, x.shape[0], recipe), _a_scale(scales.h, x.shape[0], recipe)
    x_q = quantize(x, scales.x)
    u = _scaled_mm(x_q, w_up_q, s_x, scales.up, recipe)
    h = act(_scaled_mm(x_q, w_gate, s_x, scales.gate, recipe)) * u if w_gate is not None else act(u)
    y = _scaled_mm(quantize(h, scales.h), w_down_q, s_h, scales.down, recipe)
    return y[:m] if y.shape[0] != m else y


def torch_path(x, w_up_q, w_down_q, scales, *, w_gate=None, activation="silu", recipe=None):
    """The same FP8 FFN as ``reference``, in PyTorch's own FP8 ops: the fair baseline for the fused kernel
    on a Hopper GPU (CUDA only; ``torch._scaled_mm`` has no CPU kernel for these recipes).

    x is quantized with ``quantize(x, scales.x)``; the up (and gate) GEMMs are ``torch._scaled_mm`` with
    bfloat16 results; ``act(G) * U`` (or ``act(U)``) in bfloat16 ops; H quantized with ``scales.h``; the
    down GEMM ``torch._scaled_mm`` again. The intermediates are bfloat16 where the kernel keeps fp32, so
    the result is close to, not equal to, ``reference``'s.

    Two ways to give ``_scaled_mm`` the scales (``recipe``):

    - ``"tensorwise"``: ``scale_a`` the per-tensor activation scale, ``scale_b`` 1.0, and the per-row weight
      scales multiplied into the bfloat16 result (one more elementwise kernel per GEMM);
    - ``"rowwise"``: ``scale_a`` [M, 1] filled with the activation scale, ``scale_b`` [1, N] the per-row
      weight scales, both applied inside the GEMM.

    At decode sizes tensorwise GEMMs stream FP8 weights faster than rowwise ones (1.5-2x on the H200 with
    torch 2.11, benchmarks/RESULTS.md), so ``recipe=None`` tries tensorwise first, then rowwise.
    Whether the tokens must be padded to a multiple of 16 rows (older cuBLASLt FP8 kernels require it) is
    found the same way: unpadded first. What the first call on a device (and the first with a token count
    that is not a multiple of 16) settled on is kept in ``SCALED_MM_RECIPES`` and used from then on; make
    that first call outside CUDA-graph capture (a failed try cannot be undone inside one).

    Args:
        x: bfloat16 ``[M, d_model]`` on a CUDA device (d_model a multiple of 16).
        w_up_q, w_gate: float8_e4m3fn ``[d_ff, d_model]``, row-major (d_ff a multiple of 16).
        w_down_q: float8_e4m3fn ``[d_out, d_ff]`` (d_out a multiple of 16).
        scales: ``Scales`` on x's device.
        activation: ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"silu"``.
        recipe: ``None`` (the first of tensorwise, rowwise that this torch accepts), ``"tensorwise"`` or
            ``"rowwise"``.

    Returns:
        bfloat16 ``[M, d_out]``.

    Example:
        >>> import torch
        >>> from fuser import fp8
        >>> w_up = torch.randn(256, 64, device="cuda") * 0.02                                 # doctest: +SKIP
        >>> w_down = torch.randn(64, 256, device="cuda") * 0.02                               # doctest: +SKIP
        >>> x = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16)                       # doctest: +SKIP
        >>> q = fp8.quantize_ffn(w_up, w_down, x_samples=x, activation="gelu")                # doctest: +SKIP
        >>> fp8.torch_path(x, q.w_up, q.w_down, q.scales, activation="gelu").shape            # doctest: +SKIP
        torch.Size([1, 64])
    """
    if recipe not in (None, "tensorwise", "rowwise"):
        raise ValueError(f"recipe: expected None, 'tensorwise' or 'rowwise', got {recipe!r}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
        what = f"{x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x: expected a bfloat16 [M, d_model] tensor, got a {what}")
    if x.device.type != "cuda":
        raise ValueError(f"x: torch_path runs on CUDA only (torch._scaled_mm), got a tensor on {x.device}; use "
                         "fuser.fp8.reference elsewhere")
    _check_ffn("x", x.shape[1], x.device, w_up_q, w_down_q, scales, w_gate, None, None, None)
    for name, w in (("w_up_q", w_up_q), ("w_gate", w_gate), ("w_down_q", w_down_q)):
        if w is not None and not w.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous (row-major) matrix, whose transpose is the column-major "
                             "operand torch._scaled_mm takes; pass it .contiguous()")
    for name, n in (("d_model", x.shape[1]), ("d_ff", w_up_q.shape[0]), ("d_out", w_down_q.shape[0])):
        if n % 16:
            raise ValueError(f"{name}: torch._scaled_mm needs it a multiple of 16, got {n}")
    act = _activation(activation)
    key = (x.device, x.shape[0] % 16 == 0, recipe)
    known = SCALED_MM_RECIPES.get(key)
    if known is not None:
        return _torch_path_once(x, w_up_q, w_down_q, scales, w_gate, act, *known)
    errors = []
    for tried in (("tensorwise", "rowwise") if recipe is None else (recipe,)):
        for rows in ((1,) if key[1] else (1, 16)):
            try:
                y = _torch_path_once(x, w_up_q, w_down_q, scales, w_gate, act, tried, rows)
            except (RuntimeError, ValueError, NotImplementedError) as e:
                errors.append(f"{tried}, rows padded to {rows}: {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            SCALED_MM_RECIPES[key] = (tried, rows)
            return y
    raise RuntimeError("torch_path: torch._scaled_mm accepted none of the recipes tried on "
                       f"{x.device} (torch {torch.__version__}):\n  " + "\n  ".join(errors))

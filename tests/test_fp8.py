"""fuser.fp8: the e4m3 quantizers' error bounds and edge cases, reference() against an independent float64
computation of the same W8A8 recipe and against the bfloat16 FFN, the argument checks' messages, and
torch_path against reference on a Hopper GPU."""
import math

import pytest
import torch

from fuser import fp8
from fuser.reference import ffn_reference

ACTS = ["relu", "gelu", "gelu_tanh", "silu"]


def _e4m3_grid():
    """Every finite non-negative e4m3 value, as float32."""
    v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return v[torch.isfinite(v) & (v >= 0)].unique()


# --- the quantizers ---------------------------------------------------------------------------------------

def test_e4m3_rounds_to_nearest_even_and_saturates():
    grid = _e4m3_grid()
    assert grid.max().item() == 448.0 and len(grid) == 127
    mids = (grid[1:] + grid[:-1]) / 2          # ties: the neighbour with an even mantissa (the last bit 0)
    got = fp8.e4m3(mids).view(torch.uint8)
    assert (got & 1 == 0).all()
    assert fp8.e4m3(torch.tensor([449.0, 464.0, 1e30, -1e30, float("inf")])).float().tolist() == \
        [448.0, 448.0, 448.0, -448.0, 448.0]
    assert math.isnan(fp8.e4m3(torch.tensor([float("nan")])).float().item())


def test_quantize_weight_error_bound_on_random_data():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = (torch.randn(64, 300) * 0.02).to(dtype)
        w_q, scale = fp8.quantize_weight(w)
        assert w_q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (64,)
        back = w_q.float() * scale[:, None]
        wf = w.float()
        normal = wf.abs() >= 2.0 ** -6 * scale[:, None]     # e4m3's normal range, where 3 mantissa bits hold
        rel = ((back - wf).abs() / wf.abs())[normal]
        assert rel.max().item() <= 2.0 ** -4
        sub = ~normal                                       # subnormals: absolute error at most half a step
        assert ((back - wf).abs()[sub] <= 2.0 ** -10 * scale[:, None].expand_as(wf)[sub] * (1 + 1e-6)).all()
        assert (w_q.float().abs().amax(dim=1) == 448).all()  # each row's largest value maps to 448


def test_quantize_weight_is_exact_on_the_grid_times_a_scale():
    torch.manual_seed(1)
    grid = _e4m3_grid()
    g = grid[torch.randint(len(grid), (16, 40))] * torch.where(torch.rand(16, 40) < 0.5, -1.0, 1.0)
    g[:, 0] = 448.0                                          # each row reaches the top of the range
    c = 2.0 ** torch.randint(-12, 4, (16,)).float()          # a power of two per row: w / scale is exact
    w_q, scale = fp8.quantize_weight(g * c[:, None])
    assert torch.equal(scale, c)
    assert torch.equal(w_q.float(), g)


def test_quantize_weight_zero_rows_and_tiny_rows():
    w = torch.zeros(3, 8)
    w[1, 2] = -3.0
    w[2, 5] = 1e-44                                          # amax / 448 underflows to 0 in fp32
    w_q, scale = fp8.quantize_weight(w)
    assert scale[0].item() == 1.0 and scale[2].item() == 1.0
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (w_q.float()[0] == 0).all() and w_q.float()[1, 2].item() == -448.0
    assert torch.isfinite(w_q.float()).all()


@pytest.mark.parametrize("w, exc, match", [
    (torch.randn(4), ValueError, r"w: expected a 2-D \[rows, cols\] weight matrix, got shape \[4\].*nn.Linear"),
    (torch.randn(2, 3, 4), ValueError, r"w: expected a 2-D"),
    (torch.zeros(0, 4), ValueError, r"w: expected a non-empty matrix"),
    (torch.ones(2, 2, dtype=torch.int32), TypeError, r"w: expected a floating-point tensor .* got torch.int32"),
    ([[1.0]], TypeError, r"w: expected a torch.Tensor"),
    (torch.tensor([[1.0, float("nan")]]), ValueError, r"w: holds NaN or infinite values; pass a finite"),
    (torch.tensor([[1.0, float("inf")]]), ValueError, r"w: holds NaN or infinite"),
])
def test_quantize_weight_rejects_bad_input(w, exc, match):
    with pytest.raises(exc, match=match):
        fp8.quantize_weight(w)


def test_quantize_uses_the_fp32_reciprocal_and_keeps_fp32_products():
    torch.manual_seed(2)
    x = torch.randn(5, 64, dtype=torch.bfloat16) * 3
    s = torch.tensor([0.0123], dtype=torch.float32)
    expect = fp8.e4m3(x.float() * torch.reciprocal(s))
    for scale in (s, s.reshape(()), 0.0123):
        got = fp8.quantize(x, scale)
        assert got.dtype == torch.float8_e4m3fn and got.shape == x.shape
        assert torch.equal(got.view(torch.uint8), expect.view(torch.uint8))
    assert fp8.quantize(torch.tensor(2.0), 0.5).shape == ()
    assert fp8.quantize(torch.tensor([1.0, -1.0]), 1 / 1024).float().tolist() == [448.0, -448.0]


@pytest.mark.parametrize("scale, exc, match", [
    (torch.ones(2), ValueError, r"scale: expected one per-tensor scale \(shape \[\] or \[1\]\), got shape \[2\]"),
    (0.0, ValueError, r"scale: expected a positive finite scale, got 0.0"),
    (float("inf"), ValueError, r"scale: expected a positive finite"),
    ("1", TypeError, r"scale: expected a float32 tensor of one element or a Python float, got str"),
])
def test_quantize_rejects_bad_scales(scale, exc, match):
    with pytest.raises(exc, match=match):
        fp8.quantize(torch.ones(3), scale)


def test_activation_scale():
    s = fp8.activation_scale(torch.tensor([[0.5, -4.48], [1.0, 2.0]], dtype=torch.bfloat16))
    assert s.dtype == torch.float32 and s.shape == (1,)
    assert s.item() == pytest.approx(torch.tensor(-4.48, dtype=torch.bfloat16).abs().item() / 448, rel=1e-7)
    assert fp8.activation_scale(torch.zeros(4, 4)).tolist() == [1.0]
    x = torch.randn(32, 16)
    assert fp8.quantize(x, fp8.activation_scale(x)).float().abs().max().item() == 448.0
    with pytest.raises(ValueError, match="samples: holds NaN or infinite values; calibrate on finite"):
        fp8.activation_scale(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="samples: expected at least one"):
        fp8.activation_scale(torch.zeros(0, 4))


# --- reference() against an independent float64 computation --------------------------------------------

ACT64 = {
    "relu": lambda v: v.clamp_min(0),
    "gelu": lambda v: 0.5 * v * (1 + torch.erf(v / math.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1 + torch.exp(-v)),
}


def _ffn(d_model, d_ff, d_out, gated, bias, seed):
    g = torch.Generator().manual_seed(seed)
    w = {"w_up": torch.randn(d_ff, d_model, generator=g) * 0.1, "w_down": torch.randn(d_out, d_ff, generator=g) * 0.1}
    if gated:
        w["w_gate"] = torch.randn(d_ff, d_model, generator=g) * 0.1
    b = {}
    if bias:
        b = {"b_up": (torch.randn(d_ff, generator=g) * 0.1).bfloat16(),
             "b_down": (torch.randn(d_out, generator=g) * 0.1).half()}
        if gated:
            b["b_gate"] = (torch.randn(d_ff, generator=g) * 0.1).bfloat16()
    return w, b


def _reference64(x_q, q, b, activation):
    """The W8A8 FFN in float64, written out from the definition (H's e4m3 rounding the same rule)."""
    s = q.scales
    a = x_q.double().reshape(-1, x_q.shape[-1])
    act = ACT64[activation]

    def gemm(w, s_w, bias):
        out = (a @ w.double().T) * (s.x.double() * s_w.double())
        return out if bias is None else out + bias.double()
    u = gemm(q.w_up, s.up, b.get("b_up"))
    h = act(gemm(q.w_gate, s.gate, b.get("b_gate"))) * u if q.w_gate is not None else act(u)
    h_q = fp8.e4m3(h / s.h.double()).double()
    y = (h_q @ q.w_down.double().T) * (s.h.double() * s.down.double())
    if b.get("b_down") is not None:
        y = y + b["b_down"].double()
    return y.reshape(*x_q.shape[:-1], -1), h / s.h.double()


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("m", [1, 3, 77])
def test_reference_matches_float64(activation, gated, bias, m):
    d_model, d_ff, d_out = 64, 160, 48
    w, b = _ffn(d_model, d_ff, d_out, gated, bias, seed=m)
    x = torch.randn(m, d_model, generator=torch.Generator().manual_seed(100 + m)) * 2
    samples = torch.randn(64, d_model, generator=torch.Generator().manual_seed(7)) * 2
    q = fp8.quantize_ffn(w["w_up"], w["w_down"], w_gate=w.get("w_gate"), b_up=b.get("b_up"), b_gate=b.get("b_gate"),
                         x_samples=samples, activation=activation)
    x_q = fp8.quantize(x, q.scales.x)
    y = fp8.reference(x_q, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation=activation, **b)
    assert y.dtype == torch.bfloat16 and y.shape == (m, d_out)
    y64, h_scaled = _reference64(x_q, q, b, activation)
    rel = float((y.double() - y64).norm() / y64.norm())
    assert rel < 5e-3, rel          # bfloat16 output rounding alone is ~1e-3
    # the bulk matches to bfloat16's rounding; the rest are the few H elements that sit on an e4m3
    # rounding boundary and flipped one step between the fp32 and fp64 computations
    close = (y.double() - y64).abs() <= 2.0 ** -8 * y64.abs() + 1e-3 * y64.abs().max()
    assert close.float().mean().item() >= 0.97
    assert h_scaled.abs().max().item() > 1          # the calibration puts H well inside the e4m3 range


def test_reference_keeps_leading_dimensions_and_matches_flat():
    w, b = _ffn(32, 64, 32, True, True, seed=3)
    x = torch.randn(2, 5, 32)
    q = fp8.quantize_ffn(w["w_up"], w["w_down"], w_gate=w["w_gate"], x_samples=x)
    x_q = fp8.quantize(x, q.scales.x)
    y = fp8.reference(x_q, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, **b)
    flat = fp8.reference(x_q.reshape(10, 32), q.w_up, q.w_down, q.scales, w_gate=q.w_gate, **b)
    assert y.shape == (2, 5, 32) and torch.equal(y.reshape(10, 32), flat)
    one = fp8.reference(x_q[0, 0], q.w_up, q.w_down, q.scales, w_gate=q.w_gate, **b)   # one token, 1-D
    assert one.shape == (32,) and torch.equal(one, flat[0])


@pytest.mark.parametrize("gated, activation", [(True, "silu"), (False, "gelu"), (True, "gelu_tanh"), (False, "relu")])
def test_reference_approximates_the_bf16_ffn(gated, activation):
    """Quantized with sensible scales (calibrated on other samples of the same distribution), the W8A8 FFN is
    within a few percent of the FFN on the unquantized weights: each e4m3 rounding (3 mantissa bits) adds
    ~2.7% RMS to a GEMM's result, so ~5% (plain) to ~6.5% (gated: three weight matrices)."""
    torch.manual_seed(4)
    d_model, d_ff = 512, 1376
    w_up, w_down = torch.randn(d_ff, d_model) * 0.02, torch.randn(d_model, d_ff) * 0.02
    w_gate = torch.randn(d_ff, d_model) * 0.02 if gated else None
    x, samples = torch.randn(33, d_model), torch.randn(256, d_model)
    q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=samples, activation=activation)
    y = fp8.reference(fp8.quantize(x, q.scales.x), q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation=activation)
    bf = [t if t is None else t.bfloat16() for t in (x, w_up, w_down, w_gate)]
    ref = ffn_reference(*bf[:3], w_gate=bf[3], activation=activation, compute_dtype=torch.float64)
    rel = float((y.double() - ref).norm() / ref.norm())
    assert rel < 0.08, rel


# --- reference()'s argument checks ----------------------------------------------------------------------

def _valid(gated=True):
    w, b = _ffn(32, 48, 16, gated, True, seed=5)
    q = fp8.quantize_ffn(w["w_up"], w["w_down"], w_gate=w.get("w_gate"), x_samples=torch.randn(4, 32))
    x_q = fp8.quantize(torch.randn(3, 32), q.scales.x)
    return dict(x_q=x_q, w_up=q.w_up, w_down=q.w_down, scales=q.scales, w_gate=q.w_gate, **b), w


def _bad(**change):
    args, w = _valid()
    args.update({k: (v(args, w) if callable(v) else v) for k, v in change.items()})
    return args


@pytest.mark.parametrize("args, exc, match", [
    (_bad(w_up=lambda a, w: w["w_up"].bfloat16()), TypeError,
     r"w_up: expected torch.float8_e4m3fn, got torch.bfloat16; quantize it with fuser.fp8.quantize_weight"),
    (_bad(w_gate=lambda a, w: w["w_gate"]), TypeError, r"w_gate: expected torch.float8_e4m3fn, got torch.float32"),
    (_bad(w_down=lambda a, w: w["w_down"].half()), TypeError, r"w_down: expected torch.float8_e4m3fn"),
    (_bad(x_q=lambda a, w: a["x_q"].float().int()), TypeError,
     r"x_q: expected a floating-point tensor \(x in a floating-point dtype, or quantized\), got torch.int32"),
    (_bad(x_q=lambda a, w: a["x_q"][:, :16]), ValueError, r"w_up: expected shape \[d_ff, 16\]"),
    (_bad(w_down=lambda a, w: a["w_down"][:, :40]), ValueError, r"w_down: expected shape \[d_out, 48\]"),
    (_bad(w_gate=lambda a, w: a["w_gate"][:40]), ValueError, r"w_gate: expected the shape of w_up, \[48, 32\]"),
    (_bad(w_up=lambda a, w: a["w_up"].reshape(-1)), ValueError, r"w_up: expected a 2-D \[d_ff, d_model\] matrix"),
    (_bad(scales=lambda a, w: tuple(a["scales"])), TypeError, r"scales: expected a fuser.fp8.Scales, got tuple"),
    (_bad(scales=lambda a, w: a["scales"]._replace(up=a["scales"].up[None])), ValueError,
     r"scales.up: expected shape \[48\] \(one scale per row of w_up\), got \[1, 48\]"),
    (_bad(scales=lambda a, w: a["scales"]._replace(down=a["scales"].down[:8])), ValueError,
     r"scales.down: expected shape \[16\]"),
    (_bad(scales=lambda a, w: a["scales"]._replace(up=a["scales"].up.double())), TypeError,
     r"scales.up: expected torch.float32, got torch.float64"),
    (_bad(scales=lambda a, w: a["scales"]._replace(x=torch.ones(2))), ValueError,
     r"scales.x: expected one per-tensor scale \(shape \[\] or \[1\]\), got shape \[2\]"),
    (_bad(scales=lambda a, w: a["scales"]._replace(h=torch.ones(1, dtype=torch.bfloat16))), TypeError,
     r"scales.h: expected torch.float32, got torch.bfloat16"),
    (_bad(scales=lambda a, w: a["scales"]._replace(gate=None)), ValueError, r"scales.gate: w_gate is given"),
    (_bad(w_gate=None, b_gate=None), ValueError, r"scales.gate: given for a plain FFN"),
    (_bad(b_up=lambda a, w: a["b_up"].float()), TypeError,
     r"b_up: expected torch.bfloat16 or torch.float16, got torch.float32"),
    (_bad(b_down=lambda a, w: a["b_down"][:4]), ValueError, r"b_down: expected shape \[16\]"),
    (_bad(scales=lambda a, w: a["scales"]._replace(up=a["scales"].up.to("meta"))), ValueError,
     r"scales.up: on meta, but x_q is on cpu"),
    (_bad(activation="swish"), ValueError, r"activation: unknown activation 'swish'; expected one of relu, gelu"),
])
def test_reference_rejects_bad_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        fp8.reference(**args)


def test_reference_rejects_a_gate_bias_without_a_gate():
    args, _ = _valid(gated=False)
    with pytest.raises(ValueError, match="b_gate: given for a plain FFN"):
        fp8.reference(**dict(args, b_gate=torch.zeros(48, dtype=torch.bfloat16)))


def test_quantize_ffn_names_the_bad_weight():
    with pytest.raises(ValueError, match=r"w_down: expected a 2-D"):
        fp8.quantize_ffn(torch.randn(8, 4), torch.randn(8), x_samples=torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"w_gate: holds NaN"):
        fp8.quantize_ffn(torch.randn(8, 4), torch.randn(4, 8), w_gate=torch.full((8, 4), float("nan")),
                         x_samples=torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"x_samples: expected shape \[\.\.\., 4\]"):
        fp8.quantize_ffn(torch.randn(8, 4), torch.randn(4, 8), x_samples=torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"w_up, w_gate, w_down: expected"):
        fp8.quantize_ffn(torch.randn(8, 4), torch.randn(4, 6), x_samples=torch.randn(2, 4))



def test_quantize_ffn_of_parameters_gives_constants():
    """An nn.Linear's Parameters passed as they are (and samples that require grad): the quantized weights and
    every scale are constants, so fuser.ffn can take them to C (DLPack refuses tensors that require grad) and
    a call with grad enabled is not sent to the eager ops for their sake."""
    up, gate, down = torch.nn.Linear(16, 64, bias=True), torch.nn.Linear(16, 64, bias=True), torch.nn.Linear(64, 16)
    x = torch.randn(8, 16, requires_grad=True)
    q = fp8.quantize_ffn(up.weight, down.weight, w_gate=gate.weight, b_up=up.bias, b_gate=gate.bias,
                         x_samples=x, activation="silu")
    held = [q.w_up, q.w_down, q.w_gate, *q.scales]
    assert not any(t.requires_grad for t in held if t is not None)
    w_q, s = fp8.quantize_weight(up.weight)
    assert not w_q.requires_grad and not s.requires_grad and not fp8.activation_scale(x).requires_grad
    # the same constants as from detached inputs
    d = fp8.quantize_ffn(up.weight.detach(), down.weight.detach(), w_gate=gate.weight.detach(),
                         b_up=up.bias.detach(), b_gate=gate.bias.detach(), x_samples=x.detach(), activation="silu")
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(held, [d.w_up, d.w_down, d.w_gate, *d.scales]))

# --- torch_path -----------------------------------------------------------------------------------------

def test_torch_path_says_it_needs_cuda():
    args, _ = _valid()
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x: torch_path runs on CUDA only .* use fuser.fp8.reference elsewhere"):
        fp8.torch_path(x, args["w_up"], args["w_down"], args["scales"], w_gate=args["w_gate"])
    with pytest.raises(TypeError, match=r"x: expected a bfloat16 \[M, d_model\] tensor, got a torch.float32"):
        fp8.torch_path(x.float(), args["w_up"], args["w_down"], args["scales"], w_gate=args["w_gate"])


def test_torch_path_rejects_an_unknown_recipe():
    args, _ = _valid()
    with pytest.raises(ValueError, match=r"recipe: expected None, 'tensorwise' or 'rowwise', got 'blockwise'"):
        fp8.torch_path(torch.randn(3, 32, dtype=torch.bfloat16), args["w_up"], args["w_down"], args["scales"],
                       w_gate=args["w_gate"], recipe="blockwise")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "tensorwise", "rowwise"])
@pytest.mark.parametrize("gated, activation", [(True, "silu"), (False, "gelu")])
@pytest.mark.parametrize("m", [1, 3, 16, 77])
def test_torch_path_matches_reference_on_hopper(gated, activation, m, recipe):
    """PyTorch's FP8 path (needs a Hopper GPU: torch._scaled_mm) against reference: bfloat16 intermediates
    instead of fp32 ones, so close but not equal."""
    torch.manual_seed(6)
    d_model, d_ff = 256, 512
    w_up, w_down = torch.randn(d_ff, d_model, device="cuda") * 0.02, torch.randn(d_model, d_ff, device="cuda") * 0.02
    w_gate = torch.randn(d_ff, d_model, device="cuda") * 0.02 if gated else None
    q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=torch.randn(64, d_model, device="cuda"),
                         activation=activation)
    x = torch.randn(m, d_model, device="cuda", dtype=torch.bfloat16)
    y = fp8.torch_path(x, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation=activation, recipe=recipe)
    ref = fp8.reference(fp8.quantize(x, q.scales.x), q.w_up, q.w_down, q.scales, w_gate=q.w_gate,
                        activation=activation)
    assert y.dtype == torch.bfloat16 and y.shape == (m, d_model)
    assert float((y.double() - ref.double()).norm() / ref.double().norm()) < 3e-2
    used, rows = fp8.SCALED_MM_RECIPES[(x.device, m % 16 == 0, recipe)]
    assert used == (recipe or used) and rows in (1, 16)

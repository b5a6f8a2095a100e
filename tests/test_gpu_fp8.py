"""The quantized (FP8, W8A8) stream kernel on a Hopper GPU (marked gpu; skipped with a reason elsewhere):
``fuser.ffn(..., scales=...)`` against ``fuser.fp8.reference`` (the kernel's meaning in fp32 PyTorch ops)
on fresh random weights, plain and gated, with and without biases, every activation, ragged token counts
(one row tile and several), K splits in both phases (their partial sums), NaN-poisoned outputs that must
be written whole, bitwise-identical repeats, and a CUDA graph replay."""
import pytest
import torch

import fuser
from fuser import fp8
from conftest import rel_error

pytestmark = pytest.mark.gpu

# The kernel's e4m3 MMAs sum each K step of 128 products in fewer bits than fp32 (about 14) before the
# step's sum is added to the fp32 accumulator; H then rounds to e4m3 (steps of 2^-3 relative), where a
# value whose sum moved across a rounding boundary lands one step away, and a few such steps in a small H
# weigh more than many in a large one: measured 2.9-5.0e-3 on the 7B-70B decode shapes and 2.7e-3 to
# 1.05e-2 on the small ones below (H200), against the recipe's own 5-7e-2 from the bf16 FFN. A wrong scale,
# a missing bias, a lost split or a misplaced tile costs 5e-2 and more.
BOUND = 2e-2


def quantized(gen, m, d, f, l, *, gated, bias, activation):
    """Random weights at unit output scale, quantized with scales calibrated on x itself: x (bfloat16, which
    the kernel quantizes) and the call's keyword arguments for fuser.ffn and fp8.reference."""
    def r(*s, scale=1.0):
        return torch.randn(*s, generator=gen, device="cuda") * scale
    w_up, w_down = r(f, d, scale=d ** -0.5), r(l, f, scale=f ** -0.5)
    w_gate = r(f, d, scale=d ** -0.5) if gated else None
    x = r(m, d)
    q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=x, activation=activation)
    t = dict(w_up=q.w_up, w_down=q.w_down, w_gate=q.w_gate, scales=q.scales, activation=activation)
    if bias:
        t["b_up"], t["b_down"] = r(f, scale=0.3).bfloat16(), r(l, scale=0.3).bfloat16()
        if gated:
            t["b_gate"] = r(f, scale=0.3).bfloat16()
    return x.bfloat16(), t


def check(x, t, plan=None, runs=3):
    """`runs` calls into NaN-poisoned outputs: every element written, each bitwise the first, the first
    within BOUND of fp8.reference (relative Frobenius error)."""
    ref = fp8.reference(x, **t)
    outs = []
    for _ in range(runs):
        out = torch.full(ref.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        fuser.ffn(x, out=out, plan=plan, **t)
        outs.append(out)
    torch.cuda.synchronize()
    assert not torch.isnan(outs[0]).any()
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    return rel_error(outs[0], ref)


CASES = [  # (d_model, d_ff, d_out, gated, bias, activation)
    (512, 1536, 512, True, False, "silu"),
    (256, 1024, 384, False, True, "gelu"),
    (384, 640, 256, True, True, "gelu_tanh"),
    (256, 512, 256, False, False, "relu"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{'gated' if c[3] else 'plain'}"
                         f"-{'bias' if c[4] else 'nobias'}-{c[5]}")
@pytest.mark.parametrize("m", [1, 3, 16, 17, 45, 77, 130])
def test_planner_choice_matches_the_reference(case, m):
    d, f, l, gated, bias, act = case
    x, t = quantized(torch.Generator(device="cuda").manual_seed(m * 31 + d), m, d, f, l, gated=gated, bias=bias,
                       activation=act)
    plan = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, dtype="float8_e4m3fn", fused=True,
                      bias=tuple(r for r in ("up", "gate", "down") if t.get("b_" + r) is not None))
    assert plan.fused and plan.raw["params"]["bm"] in (16, 32, 64)
    assert check(x, t, plan) < BOUND


@pytest.mark.parametrize("bm,s1,s2", [(16, 1, 1), (16, 2, 3), (32, 3, 2), (32, 1, 4), (64, 1, 1), (64, 2, 3)])
def test_splits_and_row_tiles(bm, s1, s2):
    """K splits in phase 1 (their summed partials scaled after the sum) and d_ff splits in phase 2, in one
    row tile and in several (m = 70 over bm 16: five; m = 130 over bm 64: three, the last of two tokens)."""
    for m in (5, 70, 130):
        x, t = quantized(torch.Generator(device="cuda").manual_seed(m + s1 + s2), m, 1024, 2048, 512, gated=True,
                           bias=True, activation="silu")
        plan = fuser.plan(m, 1024, 2048, d_out=512, gated=True, activation="silu", dtype="float8_e4m3fn", fused=True,
                          bias=("up", "gate", "down"), kind="stream", bm=bm, s1=s1, s2=s2)
        assert check(x, t, plan) < BOUND, (m, plan.summary())


@pytest.mark.parametrize("bm,m", [(16, 3), (32, 70), (64, 130), (128, 77)])
def test_exact_token_boxes_give_the_whole_boxes_bits(bm, m):
    """With exact token boxes (``_C.stream_exact_boxes``) a quantized chain's X and H tiles come from whole row
    tiles of the padded scratch: within BOUND of the reference and the bits of whole boxes (TMA's zero fill)."""
    from fuser import _C
    gated = bm != 128
    x, t = quantized(torch.Generator(device="cuda").manual_seed(bm + m), m, 512, 1536, 384, gated=gated, bias=True,
                     activation="silu" if gated else "gelu")
    plan = fuser.plan(m, 512, 1536, d_out=384, gated=gated, activation=t["activation"], dtype="float8_e4m3fn",
                      fused=True, bias=("up", "gate", "down") if gated else ("up", "down"), kind="stream", bm=bm)
    outs = []
    for on in (False, True):
        before = _C.stream_exact_boxes(on)
        try:
            assert check(x, t, plan) < BOUND, (on, plan.summary())
            outs.append(fuser.ffn(x, plan=plan, **t))
        finally:
            _C.stream_exact_boxes(before)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("s1,s2", [(1, 1), (2, 3), (1, 4)])
def test_plain_128_token_tiles(s1, s2):
    """A plain FFN's quantized tiles of 128 tokens (wgmma n128): one row tile, several (the last ragged), and
    fewer tokens than a tile, with K splits in both phases."""
    for m in (5, 130, 257):
        x, t = quantized(torch.Generator(device="cuda").manual_seed(m + 7 * s2), m, 512, 1536, 384, gated=False,
                         bias=True, activation="gelu")
        plan = fuser.plan(m, 512, 1536, d_out=384, activation="gelu", dtype="float8_e4m3fn", fused=True,
                          bias=("up", "down"), kind="stream", bm=128, s1=s1, s2=s2)
        assert check(x, t, plan) < BOUND, (m, plan.summary())


@pytest.mark.parametrize("gated,bm,s2", [(False, 128, 2), (True, 128, 4), (True, 128, 3), (True, 64, 4)])
def test_row_partials_of_many_tokens(gated, bm, s2):
    """Tiles of 128 tokens keep phase 2's split partials as the real token rows, which every block sums after
    the last unit; with more of y's 4-element groups than the grid has threads (here 150 x 1152 / 4 = 43200),
    each thread sums several of them at a time (tiles of 64 tokens: the last split's sum, beside them). Ragged
    last row tile, every bias."""
    m, d, f, l = 150, 512, 1024, 1152
    bias = ("up", "gate", "down") if gated else ("up", "down")
    x, t = quantized(torch.Generator(device="cuda").manual_seed(11 * s2 + bm), m, d, f, l, gated=gated, bias=True,
                     activation="silu")
    plan = fuser.plan(m, d, f, d_out=l, gated=gated, activation="silu", dtype="float8_e4m3fn", fused=True,
                      bias=bias, kind="stream", bm=bm, s1=1, s2=s2)
    assert check(x, t, plan) < BOUND, plan.summary()

@pytest.mark.parametrize("s2", [1, 3])
def test_gated_128_token_tiles(s2):
    """A gated FFN's quantized tiles of 128 tokens (both parts in turn through one fresh sum): one row tile,
    several (the last ragged) and fewer tokens than a tile, with d_ff splits in phase 2, every bias."""
    for m in (5, 130, 257):
        x, t = quantized(torch.Generator(device="cuda").manual_seed(m + 5 * s2), m, 512, 1536, 384, gated=True,
                         bias=True, activation="silu")
        plan = fuser.plan(m, 512, 1536, d_out=384, gated=True, activation="silu", dtype="float8_e4m3fn", fused=True,
                          bias=("up", "gate", "down"), kind="stream", bm=128, s1=1, s2=s2)
        assert check(x, t, plan) < BOUND, (m, plan.summary())


def test_the_eager_route_runs_rowwise_gemms_at_multiples_of_their_token_count():
    """fuser.fp8.eager (the route the planner may pick) runs the same ops as torch_path's rowwise recipe at
    whole multiples of ROWWISE_TOKENS tokens and from 512 on, and as its tensorwise recipe elsewhere:
    bitwise equal results."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    r = fp8.ROWWISE_TOKENS
    for m, recipe in ((r - 16, "tensorwise"), (r, "rowwise"), (r + 32, "tensorwise"), (2 * r, "rowwise"),
                      (4 * r + 64, "rowwise")):
        x, t = quantized(gen, m, 256, 512, 256, gated=True, bias=False, activation="silu")
        y = fp8.eager(fp8.quantize(x, t["scales"].x), t["w_up"], t["w_down"], t["scales"], w_gate=t["w_gate"],
                      activation="silu")
        ref = fp8.torch_path(x, t["w_up"], t["w_down"], t["scales"], w_gate=t["w_gate"], activation="silu",
                             recipe=recipe)
        assert torch.equal(y, ref), (m, recipe)


@pytest.mark.parametrize("m", [1, 128])
def test_long_sums_are_promoted_to_fp32(m):
    """A LLaMA-3-8B FFN at one token (and at 128, in one 128-token tile): sums over K = 4096 and d_ff = 14336 left
    in the e4m3 MMAs' own accumulators drift to 1.2-1.4e-2 from the reference; promoted to fp32 every K step,
    they stay at 3-5e-3 (docs/kernels.md, step 31)."""
    x, t = quantized(torch.Generator(device="cuda").manual_seed(11), m, 4096, 14336, 4096, gated=True, bias=False,
                     activation="silu")
    assert check(x, t, runs=2) < 7e-3


def test_close_to_the_bf16_ffn():
    """The FP8 FFN approximates the bf16 one it was quantized from (a few percent on random weights)."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    d, f = 1024, 2816
    w_up, w_gate, w_down = (torch.randn(*s, generator=gen, device="cuda") * s[1] ** -0.5
                            for s in ((f, d), (f, d), (d, f)))
    x = torch.randn(8, d, generator=gen, device="cuda")
    q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=x, activation="silu")
    y = fuser.ffn(x.bfloat16(), q.w_up, q.w_down, w_gate=q.w_gate, activation="silu", scales=q.scales)
    ref = fuser.ffn_reference(x.double(), w_up.double(), w_down.double(), w_gate=w_gate.double(), activation="silu")
    assert y.dtype == torch.bfloat16 and rel_error(y, ref) < 0.08


def test_in_a_cuda_graph():
    x, t = quantized(torch.Generator(device="cuda").manual_seed(3), 4, 512, 1536, 512, gated=True, bias=False,
                       activation="silu")
    out = torch.empty(4, 512, device="cuda", dtype=torch.bfloat16)
    fuser.ffn(x, out=out, **t)   # warm: compile, load, scratch
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        fuser.ffn(x, out=out, **t)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    x.copy_(torch.randn(4, 512, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_error(out, fp8.reference(x, **t)) < BOUND


@pytest.mark.parametrize("m", [3, 100])
def test_each_call_quantizes_its_own_x(m):
    """The kernel quantizes x into its workspace at every call: calls of one FFN on other x tensors of the same
    shape (the launch prepared once, re-pointed at each x) each match their own reference, and x's e4m3 copy
    of one call never serves the next (x rewritten in place between calls)."""
    x, t = quantized(torch.Generator(device="cuda").manual_seed(5 + m), m, 1024, 2048, 768, gated=True, bias=True,
                     activation="silu")
    gen = torch.Generator(device="cuda").manual_seed(6)
    xs = [x] + [torch.randn(m, 1024, generator=gen, device="cuda").bfloat16() for _ in range(2)]
    for xi in xs + xs[:1]:
        assert check(xi, t, runs=1) < BOUND
    y0 = fuser.ffn(x, **t)
    x.copy_(xs[1])
    assert torch.equal(fuser.ffn(x, **t), fuser.ffn(xs[1], **t)) and not torch.equal(y0, fuser.ffn(x, **t))


def test_bad_scales_are_clear_errors():
    x, t = quantized(torch.Generator(device="cuda").manual_seed(4), 2, 256, 512, 256, gated=True, bias=False,
                       activation="silu")
    s = t["scales"]
    with pytest.raises(ValueError, match="down_scale: expected shape \\[256\\]"):
        fuser.ffn(x, **{**t, "scales": s._replace(down=s.up)})
    with pytest.raises(ValueError, match="gate_scale: missing; a quantized FFN"):
        fuser.ffn(x, **{**t, "scales": s._replace(gate=None)})
    with pytest.raises(TypeError, match="x_scale: dtype bfloat16; scales are float32"):
        fuser.ffn(x, **{**t, "scales": s._replace(x=s.x.bfloat16())})


def test_scales_that_require_grad_still_launch():
    """quantize_ffn of an nn.Linear's Parameters, called with grad enabled: the fused launch runs (bitwise the
    plain tensors' result; the eager ops would differ) and its output needs no grad; scales a caller made
    require grad are taken as the constants they are to the kernel."""
    torch.manual_seed(5)
    up, down = torch.nn.Linear(256, 512, bias=False).cuda(), torch.nn.Linear(512, 256, bias=False).cuda()
    gate = torch.nn.Linear(256, 512, bias=False).cuda()
    x = torch.randn(16, 256, device="cuda")
    q = fp8.quantize_ffn(up.weight, down.weight, w_gate=gate.weight, x_samples=x, activation="silu")
    t = dict(w_up=q.w_up, w_down=q.w_down, w_gate=q.w_gate, activation="silu")
    xb = x.bfloat16()
    with torch.no_grad():
        want = fuser.ffn(xb, scales=q.scales, **t)
    assert not torch.equal(want, fp8.eager(xb, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation="silu"))
    y = fuser.ffn(xb, scales=q.scales, **t)
    assert torch.equal(y, want) and not y.requires_grad
    s = fp8.Scales(*(None if v is None else v.clone().requires_grad_() for v in q.scales))
    with torch.no_grad():
        assert torch.equal(fuser.ffn(xb, scales=s, **t), want)

def test_a_quantized_module_keeps_its_launch(monkeypatch):
    """FusedFFN.quantize: the first call of a shape takes fuser.ffn's general path and keeps its fused launch;
    later calls of that shape run it without validating again (no route lookup), with the same bits, even with
    the Parameters requiring grad; a bias Parameter replaced, new scales (quantize again) or dequantize are
    each seen at the next call."""
    torch.manual_seed(5)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 1536), torch.nn.GELU(), torch.nn.Linear(1536, 512))
    f = fuser.FusedFFN.from_module(mlp.cuda().bfloat16())
    x = torch.randn(16, 512, device="cuda").bfloat16()
    f.quantize(x)
    routes = []
    real_route = fuser.ops.route
    monkeypatch.setattr(fuser.ops, "route", lambda *a, **k: routes.append(1) or real_route(*a, **k))

    def expected(x):
        q, w = f.__dict__["_fp8"], f.weights()
        return fuser.ffn(x, q.w_up, q.w_down, b_up=w["b_up"].detach(), b_down=w["b_down"].detach(),
                         activation="gelu", scales=q.scales)

    y = f(x)
    assert len(routes) == 1 and f.__dict__.get("_kept") is not None
    for _ in range(3):
        x2 = torch.randn(16, 512, device="cuda").bfloat16()
        assert torch.equal(f(x2), expected(x2))
    assert len(routes) == 1 and torch.equal(y, expected(x))
    with torch.no_grad():
        mlp[0].bias.data = mlp[0].bias.data + 1.0   # new memory: the kept launch must not read the old bias
    assert torch.equal(f(x), expected(x)) and len(routes) == 2
    f.quantize(torch.randn(16, 512, device="cuda").bfloat16() * 3)
    assert torch.equal(f(x), expected(x)) and len(routes) == 3
    f.dequantize()
    with torch.no_grad():
        assert torch.equal(f(x), fuser.FusedFFN.from_module(mlp)(x))

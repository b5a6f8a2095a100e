"""Gate and up weights in one allocation, one GEMM for both on the eager route (fuser.module's packed_gate_up and
FusedFFN.pack, python/eager_bind.c's packed path, the gate kernel on the GEMM result's two halves).

On any machine: which tensors count as the two halves of one memory (either order, biases both or neither), that
``_C.eager`` then runs one GEMM for the gate and up projections with the ops' values (also where they are given
separately as the halves of one tensor, as ``fuser.ffn`` may get them), that a detached packed view
serves only calls autograd does not record through the weights (a Parameter of both serves all, its gradients
the ops'), that FusedFFN's kept route of a one-Linear gate and up (Phi-3's ``gate_up_proj``) and of weights moved
into one allocation runs packed and sees a replaced ``.data``, and what ``pack``/``unpack`` do and leave alone.
On a Hopper GPU (marked gpu): the gate kernel on rows 2 d_ff apart bitwise against the ops, what it declines,
and ``fuser.optimize`` packing a bfloat16 SwiGLU, running it packed, reverting and packing again after ``.to()``."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fuser
from fuser import _C, module as fmodule
from fuser.module import FusedFFN, packed_gate_up
from fuser.reference import ACTIVATIONS, eager
from models import hf

SILU = ACTIVATIONS["silu"]


class Counted:
    """F.linear, counting its calls and keeping each weight's shape."""

    def __init__(self):
        self.weights = []

    def __call__(self, x, w, b=None):
        self.weights.append(tuple(w.shape))
        return F.linear(x, w, b)


class SwiGLU(nn.Module):
    def __init__(self, d=32, f=96, bias=False):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias)
        self.w2 = nn.Linear(f, d, bias=bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def one_gemm(x, w, b, wd, bd, f, act=SILU, gate_first=True, in_place=False):
    """The FFN with the gate and up projections as one GEMM over `w` (the reference of the packed route): the
    product a new tensor, as the ops make it, or `in_place` in the GEMM result's gate half, as the gate kernel
    leaves it (the down GEMM then reads rows 2 f apart)."""
    p = F.linear(x, w, b)
    g, u = (p[..., :f], p[..., f:]) if gate_first else (p[..., f:], p[..., :f])
    if not in_place:
        return F.linear(act(g) * u, wd, bd)
    g.copy_(act(g) * u)
    return F.linear(g, wd, bd)


# ---- which tensors are packed ---------------------------------------------------------------------------

def test_the_two_row_halves_of_one_memory_are_packed_in_either_order():
    both, bias = torch.randn(32, 8), torch.randn(32)
    w, b, bits = packed_gate_up(both[:16], both[16:], bias[:16], bias[16:])
    assert torch.equal(w, both) and torch.equal(b, bias) and bits == 3   # gate first, a detached view
    assert w.data_ptr() == both.data_ptr() and not w.requires_grad
    w, b, bits = packed_gate_up(both[16:], both[:16])
    assert torch.equal(w, both) and b is None and bits == 2              # up first


@pytest.mark.parametrize("why", ["separate tensors", "one bias only", "biases in the other order",
                                 "not contiguous", "other dtypes", "a gap between them", "one-dimensional"])
def test_anything_else_is_not_packed(why):
    both, bias = torch.randn(32, 8), torch.randn(32)
    g, u, bg, bu = both[:16], both[16:], None, None
    if why == "separate tensors":
        g, u = torch.randn(16, 8), torch.randn(16, 8)
    elif why == "one bias only":
        bg = bias[:16]
    elif why == "biases in the other order":
        bg, bu = bias[16:], bias[:16]
    elif why == "not contiguous":
        wide = torch.randn(16, 16)
        g, u = wide[:, :8], wide[:, 8:]
    elif why == "other dtypes":
        u = both[16:].clone().to(torch.float64)
    elif why == "a gap between them":
        big = torch.randn(33, 8)
        g, u = big[:16], big[17:]
    elif why == "one-dimensional":
        g, u = bias[:16], bias[16:]
    assert packed_gate_up(g, u, bg, bu) is None


def test_a_parameter_of_both_is_used_itself():
    p = nn.Parameter(torch.randn(32, 8))
    w, b, bits = packed_gate_up(p[:16], p[16:], whole=p)
    assert w is p and b is None and bits == 1
    assert packed_gate_up(p[:16], p[16:], whole=nn.Parameter(torch.randn(32, 8)))[0] is not p   # not its memory


# ---- _C.eager's packed path -----------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gate_first", [True, False])
def test_eager_runs_one_gemm_for_gate_and_up_with_the_ops_values(bias, gate_first):
    torch.manual_seed(0)
    f = 48
    x, both, wd = torch.randn(2, 5, 16), torch.randn(2 * f, 16), torch.randn(16, f)
    bboth, bd = (torch.randn(2 * f), torch.randn(16)) if bias else (None, None)
    lo, hi = (both[:f], both[f:]), (None if bboth is None else bboth[:f], None if bboth is None else bboth[f:])
    wg, wu = lo if gate_first else lo[::-1]
    bg, bu = hi if gate_first else hi[::-1]
    pk = packed_gate_up(wg, wu, bg, bu)
    lin = Counted()
    y = _C.eager(lin, SILU, x, wu, wd, wg, bu, bg, bd, *pk)
    assert lin.weights == [(2 * f, 16), (16, f)]                         # one GEMM for gate and up, then down
    assert torch.equal(y, one_gemm(x, both, bboth, wd, bd, f, gate_first=gate_first))
    torch.testing.assert_close(y, eager(x, wu, wd, wg, bu, bg, bd, SILU))
    lin.weights.clear()
    _C.eager(lin, SILU, x, wu, wd, wg, bu, bg, bd, None, None, 0)      # no packed tensor: the five ops
    assert lin.weights == [(f, 16), (f, 16), (16, f)]


def test_a_detached_pack_serves_only_calls_autograd_does_not_record():
    torch.manual_seed(1)
    f = 24
    both = torch.randn(2 * f, 16)
    wg, wu = nn.Parameter(both[:f]), nn.Parameter(both[f:])   # (separate Parameters whose data are the halves)
    wg.data, wu.data = both[:f], both[f:]
    wd, x = nn.Parameter(torch.randn(16, f)), torch.randn(3, 16)
    pk = packed_gate_up(wg, wu)
    assert pk[2] == 3
    lin = Counted()
    y = _C.eager(lin, SILU, x, wu, wd, wg, None, None, None, *pk)
    assert len(lin.weights) == 3 and y.requires_grad                  # autograd records: the separate GEMMs
    y.square().sum().backward()
    grads = [p.grad.clone() for p in (wg, wu, wd)]
    for p in (wg, wu, wd):
        p.grad = None
    eager(x, wu, wd, wg, None, None, None, SILU).square().sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, (wg, wu, wd)))
    lin.weights.clear()
    with torch.no_grad():
        _C.eager(lin, SILU, x, wu, wd, wg, None, None, None, *pk)
    assert len(lin.weights) == 2
    lin.weights.clear()
    for p in (wg, wu):
        p.requires_grad_(False)
    _C.eager(lin, SILU, x, wu, wd, wg, None, None, None, *pk)          # grad mode on, the weights record nothing
    assert len(lin.weights) == 2


def test_a_parameter_of_both_serves_autograd_with_the_ops_gradients():
    torch.manual_seed(2)
    f = 24
    p, wd, x = nn.Parameter(torch.randn(2 * f, 16)), nn.Parameter(torch.randn(16, f)), torch.randn(3, 16)
    pk = packed_gate_up(p[:f], p[f:], whole=p)
    lin = Counted()
    _C.eager(lin, SILU, x, p[f:], wd, p[:f], None, None, None, *pk).square().sum().backward()
    assert lin.weights == [(2 * f, 16), (16, f)]
    got = p.grad.clone()
    p.grad = None
    eager(x, p[f:], wd, p[:f], None, None, None, SILU).square().sum().backward()
    # one GEMM of 2f rows sums its backward in another order than two of f rows (BLAS picks blockings by
    # shape): both are held to the float64 gradient at fp32 rounding over this chain's magnitudes (a wrong
    # or missing half of the gradient is off by the gradient's own size)
    p64, wd64 = nn.Parameter(p.detach().double()), wd.detach().double()
    eager(x.double(), p64[f:], wd64, p64[:f], None, None, None, SILU).square().sum().backward()
    tol = dict(rtol=1e-5, atol=1e-6 * p64.grad.abs().max().item())
    torch.testing.assert_close(p.grad.double(), p64.grad, **tol)
    torch.testing.assert_close(got.double(), p64.grad, **tol)


@pytest.mark.parametrize("gate_first", [True, False])
def test_halves_of_one_tensor_given_separately_run_as_one_gemm(gate_first):
    """_C.eager with nine arguments (fuser.ffn's eager route): gate and up weights that are the two row halves
    of one tensor (their ``_base``; biases likewise) run as one GEMM over that tensor, autograd included."""
    torch.manual_seed(6)
    f = 40
    w, b = nn.Parameter(torch.randn(2 * f, 16)), nn.Parameter(torch.randn(2 * f))
    wd, x = torch.randn(16, f), torch.randn(2, 3, 16)
    halves = (w[:f], w[f:]) if gate_first else (w[f:], w[:f])
    bh = (b[:f], b[f:]) if gate_first else (b[f:], b[:f])
    lin = Counted()
    y = _C.eager(lin, SILU, x, halves[1], wd, halves[0], bh[1], bh[0], None)
    assert lin.weights == [(2 * f, 16), (16, f)]
    assert torch.equal(y, one_gemm(x, w, b, wd, None, f, gate_first=gate_first))
    y.square().sum().backward()
    got = (w.grad.clone(), b.grad.clone())
    w.grad = b.grad = None
    eager(x, halves[1], wd, halves[0], bh[1], bh[0], None, SILU).square().sum().backward()
    torch.testing.assert_close(got[0], w.grad, rtol=1e-5, atol=1e-4)   # (one GEMM's sums in another order)
    torch.testing.assert_close(got[1], b.grad, rtol=1e-5, atol=1e-4)
    with torch.no_grad():   # fuser.ffn's eager route on the CPU is _C.eager
        z = fuser.ffn(x, halves[1], wd, w_gate=halves[0], b_up=bh[1], b_gate=bh[0], activation="silu")
    assert torch.equal(z, y.detach())


@pytest.mark.parametrize("why", ["separate", "a wider tensor", "biases of two tensors", "one bias",
                                 "biases in the other order", "other requires_grad"])
def test_halves_that_are_not_exactly_one_tensor_run_the_five_ops(why):
    torch.manual_seed(7)
    f = 40
    w, b, wd, x = torch.randn(2 * f, 16), torch.randn(2 * f), torch.randn(16, f), torch.randn(3, 16)
    g, u, bg, bu = w[:f], w[f:], None, None
    if why == "separate":
        g, u = w[:f].clone(), w[f:].clone()
    elif why == "a wider tensor":
        wide = torch.randn(3 * f, 16)
        g, u = wide[:f], wide[f:2 * f]
    elif why == "biases of two tensors":
        bg, bu = b[:f], b.clone()[f:]
    elif why == "one bias":
        bg = b[:f]
    elif why == "biases in the other order":
        bg, bu = b[f:], b[:f]
    elif why == "other requires_grad":
        w.requires_grad_(True)
        g, u = w[:f], w.detach()[f:]
    lin = Counted()
    y = _C.eager(lin, SILU, x, u, wd, g, bu, bg, None)
    assert len(lin.weights) == 3, why
    torch.testing.assert_close(y, eager(x, u, wd, g, bu, bg, None, SILU))


def test_eager_says_what_pack_must_be():
    x, w, wd = torch.randn(2, 8), torch.randn(32, 8), torch.randn(8, 16)
    with pytest.raises(TypeError, match="pack must be an int"):
        _C.eager(F.linear, SILU, x, w[16:], wd, w[:16], None, None, None, w, None, "gate first")
    with pytest.raises(TypeError, match="9, 10, 12 or 13 arguments"):
        _C.eager(F.linear, SILU, x, w[16:], wd, w[:16], None, None, None, w, None)


# ---- FusedFFN -------------------------------------------------------------------------------------------

def pack_here(m):
    """What FusedFFN.pack does on a CUDA device, done on the CPU: the gate's and up's Parameters (and biases)
    moved into one allocation, gate rows first."""
    g, u, bg, bu = m._pair()
    assert fmodule._one_allocation(((g, u), (bg, bu)))
    m.__dict__["_packed"] = True
    return g, u, bg, bu


def kept_fast(m):
    kept = m.__dict__["_kept"]
    assert not kept.route.fused and kept.fast is not None
    return kept.fast


def test_a_one_linear_gate_and_up_runs_packed_on_the_kept_route(monkeypatch):
    if _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API: the kept route's checks run in Python, unpacked")
    model, _ = hf("phi3")
    model.eval()
    fuser.optimize(model)
    mlp = next(mod for mod in model.modules() if isinstance(mod, FusedFFN))
    gu = mlp.get_submodule("gate_up_proj").weight
    lin = Counted()
    monkeypatch.setattr(fmodule, "_linear", lin)
    x = torch.randn(2, 3, mlp.spec.d_model)
    with torch.no_grad():
        first = mlp(x)                 # routed (Route.run, packed), then kept
        fast = kept_fast(mlp)
        assert fast.packed is gu and fast.pack == 1 and fast.linear is lin
        second = mlp(x)                # the kept route, from C
    assert lin.weights == [tuple(gu.shape), (mlp.spec.d_out, mlp.spec.d_ff)]
    w = mlp.weights()
    ref = one_gemm(x, gu, None, w["down"], None, mlp.spec.d_ff)
    assert torch.equal(first, ref) and torch.equal(second, ref)
    with torch.no_grad():
        gu.data = torch.randn_like(gu) * 0.1          # new memory: the kept packed tensor would read the old one
        torch.testing.assert_close(mlp(x), one_gemm(x, gu, None, w["down"], None, mlp.spec.d_ff))


# ---- what the planner is told -----------------------------------------------------------------------------

def _chain_of(x, u, wd, g, bu=None, bg=None):
    return _C.ffn_check(x, u, wd, g, bu, bg, None, activation="silu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_validated_chain_says_whether_gate_and_up_are_one_memory(dtype):
    f, d = 24, 16
    both, bias = torch.randn(2 * f, d, dtype=dtype), torch.randn(2 * f, dtype=dtype)
    x, wd = torch.randn(3, d, dtype=dtype), torch.randn(d, f, dtype=dtype)
    assert _chain_of(x, both[f:], wd, both[:f])["packed"] is True                        # gate first
    assert _chain_of(x, both[:f], wd, both[f:])["packed"] is True                        # up first
    assert _chain_of(x, both[f:], wd, both[:f], bias[f:], bias[:f])["packed"] is True    # biases alike
    assert _chain_of(x, both[f:], wd, both[:f].clone())["packed"] is False               # separate memories
    assert _chain_of(x, both[f:], wd, both[:f], bias[f:])["packed"] is False             # one bias only
    assert _chain_of(x, both[f:], wd, both[:f], bias[:f], bias[f:])["packed"] is False   # biases the other way
    assert _chain_of(x, both[f:], wd, None)["packed"] is False                           # not gated
    h = torch.randn(2 * f, d)                                                            # float32: no fused route
    assert _chain_of(x.float(), h[f:], wd.float(), h[:f])["packed"] is False


def test_a_packed_gated_chain_prices_its_eager_route_without_two_passes_and_idle_launches():
    """Packed, the eager route runs the gate-and-up GEMM and the gate kernel where PyTorch's ops run two GEMMs, the
    activation and the product: priced as the ops less two bfloat16 passes of H and, where one projection's GEMM
    leaves SMs without a 128 x 128 output tile, up to two launches (in proportion to the idle SMs over its tiles);
    nothing more where its tiles fill the SMs (the timings: decode saves about a launch at most). The fused plans
    are the same either way (the kernels read the weights alike)."""
    import math
    for name in ("h100", "h200"):
        t = dict(_C.targets()[name], eager_packed_merge=0.0)  # the merged GEMM priced as two (the next test)
        for m, d, f in ((1, 1024, 3072), (128, 1024, 3072), (128, 3072, 8192), (1, 4096, 14336), (128, 4096, 14336),
                        (16, 8192, 28672), (2048, 4096, 14336)):
            kw = dict(gated=True, activation="silu", target=t)
            ops, packed = (fuser.plan(m, d, f, fused=False, packed=pk, **kw).predicted_us for pk in (False, True))
            tiles = math.ceil(m / 128) * math.ceil(f / 128)
            idle = 0 if tiles >= t["sm_count"] else min(1, (t["sm_count"] - tiles) / tiles)
            saved = 2 * 2 * m * f / (t["hbm_gbs"] * 1e3) + 2 * idle * t["eager_op_us"]
            assert ops - packed == pytest.approx(saved, rel=1e-6, abs=1e-6), (name, m, d, f, ops, packed)
            assert fuser.plan(m, d, f, fused=True, packed=True, **kw).summary() == \
                fuser.plan(m, d, f, fused=True, **kw).summary()
    s8 = dict(gated=True, activation="silu", target="h200", fused=False)
    assert fuser.plan(128, 1024, 3072, **s8).predicted_us - fuser.plan(128, 1024, 3072, packed=True, **s8).predicted_us \
        > 2 * _C.targets()["h200"]["eager_op_us"]              # S8 at 128 tokens: 24 tiles on 132 SMs


# S8's packed route timed on an H100 (tokens: us; pick_diff.packed_routes over the committed H100 files)
S8_ROUTE_H100 = {16: 18.6, 64: 19.9, 77: 18.6, 96: 19.0, 128: 20.0, 160: 20.4, 256: 22.5}


def test_the_packed_gemm_fills_and_drains_once_where_both_halves_fit_on_the_sms():
    """Gate and up packed run as one GEMM: where both projections' 128 x 128 output tiles fit on the SMs at once,
    the two GEMMs are priced as one GEMM of 2 N rows, one fill and drain instead of two, in the share the target's
    ``eager_packed_merge`` gives. On the h100 table (1.0) S8's packed route at 16-256 tokens, timed 18.6-22.5 us, is
    priced within 6% (with two GEMMs 1.09-1.17x its time), and S8 at 77-160 tokens picks it (timed 1.09-1.20x faster
    than the fused picks it replaces); S2 at 192 tokens (176 tiles on 132 SMs), whose route timed 1.07x slower than
    its fused pick, keeps the pick. The H200's table takes half (0.5, the fit of its 18 timed cells of the route:
    S8 at 77-128 tokens moves to the route, S8 at 48 and 64 keeps its fused picks); a device target other than an
    H200 takes the H100's value. Where a projection's tiles fill the SMs (LLaMA-70B) nothing changes; the value is
    validated (docs/planner.md, "The merged GEMM's fill and drain")."""
    h100, h200 = (dict(_C.targets()[n]) for n in ("h100", "h200"))
    assert h100["eager_packed_merge"] == 1.0 and h200["eager_packed_merge"] == 0.5
    dev = dict(_C.target_for_device("NVIDIA H100 80GB HBM3", (9, 0), 132, 232448, 233472, 52428800, 1980000,
                                    2619000, 5120))
    assert dev["eager_packed_merge"] == 1.0
    kw = dict(gated=True, activation="silu", fused=False, packed=True)
    two = dict(h100, eager_packed_merge=0.0)
    for m, timed in S8_ROUTE_H100.items():
        one, both = (fuser.plan(m, 1024, 3072, target=t, **kw).predicted_us for t in (h100, two))
        assert abs(one / timed - 1) < 0.06 and both / timed > 1.08, (m, one, both, timed)
        assert both - one <= h100["eager_ramp_us"]
    for m in (77, 128, 160):
        assert not fuser.plan(m, 1024, 3072, gated=True, activation="silu", target=h100, packed=True).fused
        assert fuser.plan(m, 1024, 3072, gated=True, activation="silu", target=two, packed=True).fused
    for m, fused in ((48, True), (64, True), (77, False), (128, False)):
        assert fuser.plan(m, 1024, 3072, gated=True, activation="silu", target="h200", packed=True).fused == fused, m
        assert fuser.plan(m, 1024, 3072, gated=True, activation="silu", target=dict(h200, eager_packed_merge=0.0),
                          packed=True).fused
    s2 = [fuser.plan(192, 2048, 5632, target=t, **kw).predicted_us for t in (h100, two)]
    assert s2[0] == s2[1] and fuser.plan(192, 2048, 5632, gated=True, activation="silu", target=h100,
                                         packed=True).fused
    for m in (16, 2048):  # LLaMA-70B: 224 and more tiles a projection on 132 SMs
        assert fuser.plan(m, 8192, 28672, target=h100, **kw).predicted_us == \
            fuser.plan(m, 8192, 28672, target=two, **kw).predicted_us
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="eager_packed_merge"):
            fuser.plan(128, 1024, 3072, target=dict(h100, eager_packed_merge=bad), **kw)


def test_packed_needs_a_gated_16_bit_chain():
    with pytest.raises(ValueError, match="packed: only a gated 16-bit chain"):
        fuser.plan(16, 64, 256, packed=True)
    with pytest.raises(ValueError, match="packed: only a gated 16-bit chain"):
        fuser.plan(16, 64, 256, gated=True, activation="silu", dtype="float32", packed=True)
    with pytest.raises(TypeError, match="packed: expected True or False"):
        fuser.plan(16, 64, 256, gated=True, activation="silu", packed=1)


def test_a_one_linear_gate_and_ups_plan_is_the_packed_chains():
    model, _ = hf("phi3")
    model.bfloat16().eval()
    fuser.optimize(model)
    mlp = next(mod for mod in model.modules() if isinstance(mod, FusedFFN))
    assert mlp.plan_args()["packed"] is True and mlp.plan(16).chain["packed"] is True
    apart = FusedFFN.from_module(SwiGLU().bfloat16())
    assert apart.plan_args()["packed"] is False and apart.plan(16).chain["packed"] is False


def test_pack_does_nothing_off_cuda_or_where_it_does_not_apply():
    for m in (SwiGLU().bfloat16(), SwiGLU(), nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))):
        f = FusedFFN.from_module(m)
        before = [p.data_ptr() for p in f.parameters()]
        assert f.pack() is False and f.unpack() is False
        assert [p.data_ptr() for p in f.parameters()] == before


def test_weights_moved_into_one_allocation_run_packed_without_autograd(monkeypatch):
    """What FusedFFN.pack does on a CUDA device, done here by hand on the CPU: the same Parameters (values,
    state_dict) in one allocation; the kept route runs one GEMM for gate and up where autograd records
    nothing, and the five ops where it records the weights' gradients."""
    if _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API: the kept route's checks run in Python, unpacked")
    torch.manual_seed(3)
    src = SwiGLU(bias=True)
    ref = copy.deepcopy(src)
    m = FusedFFN.from_module(src)
    g, u, bg, bu = pack_here(m)
    assert m.pack() is False                                   # already one allocation
    assert m.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref.state_dict().values()))
    lin = Counted()
    monkeypatch.setattr(fmodule, "_linear", lin)
    x = torch.randn(4, 32)
    with torch.no_grad():
        m(x)
        fast = kept_fast(m)
        assert fast.pack == 3 and fast.packed.data_ptr() == g.data_ptr()
        lin.weights.clear()
        y = m(x)
    assert lin.weights == [(192, 32), (32, 96)]
    assert torch.equal(y, one_gemm(x, torch.cat((g, u)), torch.cat((bg, bu)), m.w2.weight, m.w2.bias, 96))
    torch.testing.assert_close(y, ref(x))
    lin.weights.clear()
    y = m(x)                                                   # grad mode on, the Parameters require grad
    assert len(lin.weights) == 3 and y.requires_grad
    assert m.unpack() is True and packed_gate_up(g, u, bg, bu) is None and m.unpack() is False
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x))


def test_moving_the_module_packs_again_unless_unpacked(monkeypatch):
    m = FusedFFN.from_module(SwiGLU())
    calls = []
    monkeypatch.setattr(FusedFFN, "pack", lambda self: calls.append(self) or False)
    m.to(torch.float64)
    m.half()
    assert calls == [m, m]                     # after each conversion (on a CUDA device it would pack)
    m.unpack()
    m.float()
    assert calls == [m, m]


def test_no_memory_for_the_copy_moves_nothing_and_says_so(monkeypatch):
    m = FusedFFN.from_module(SwiGLU(bias=True))
    pair = m._pair()
    before = [p.data_ptr() for p in pair]
    calls, real = [], torch.cat

    def cat(ts):
        calls.append(len(calls))
        if len(calls) == 2:                    # the biases' copy, after the weights' succeeded
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(ts)
    monkeypatch.setattr(torch, "cat", cat)
    with pytest.warns(RuntimeWarning, match="no memory to put a gated FFN's gate and up weights in one allocation"):
        assert fmodule._one_allocation(((pair[0], pair[1]), (pair[2], pair[3]))) is False
    assert [p.data_ptr() for p in pair] == before and packed_gate_up(*pair) is None


def test_a_packed_model_saves_and_loads_with_safetensors(tmp_path):
    """Parameters that are views of one allocation save as separate tensors (Hugging Face save_pretrained,
    safetensors) and load back equal."""
    model, inputs = hf("llama")
    model.eval()
    fuser.optimize(model)
    ffns = [m for m in model.modules() if isinstance(m, FusedFFN)]
    for m in ffns:
        pack_here(m)
    assert all(packed_gate_up(*m._pair()) is not None for m in ffns)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    with torch.no_grad():
        torch.testing.assert_close(fuser.optimize(loaded)(**inputs).logits, model(**inputs).logits)


# ---- on a Hopper GPU -------------------------------------------------------------------------------------

def launches():
    return _C.gate_info()["launches"]


def same(a, b):
    """Bitwise equal where not NaN, NaN at the same places."""
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb) and (a.view(torch.int16) == b.view(torch.int16))[~na].all())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (77, 1024), (2, 5, 96), (4099, 8), (1, 1, 14336)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_the_gate_kernel_on_the_halves_of_one_gemm_result(shape, dtype, act):
    gen = torch.Generator(device="cuda").manual_seed(4)
    c = shape[-1]
    both = (torch.randn(*shape[:-1], 2 * c, device="cuda", generator=gen) * 3).to(dtype)
    for gate_first in (True, False):
        p = both.clone()
        g, u = p.chunk(2, -1) if gate_first else p.chunk(2, -1)[::-1]
        g0, u0 = g.clone(), u.clone()
        n = launches()
        assert _C.gate(g, u, ACTIVATIONS[act]) is True and launches() == n + 1
        assert same(g, ACTIVATIONS[act](g0) * u0) and torch.equal(u, u0)


@pytest.mark.gpu
def test_the_gate_kernel_declines_halves_it_cannot_take():
    p = torch.randn(16, 24, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    cases = {
        "columns not a multiple of 8": p.chunk(2, -1),
        "the same elements": (q[:, :32], q[:, :32]),
        "overlapping halves": (q[:, :32], q[:, 16:48]),
        "other strides": (q[:, :32], torch.randn(16, 32, device="cuda", dtype=torch.bfloat16)),
        "columns apart": (q[:, ::2], q[:, 1::2]),
    }
    n = launches()
    for why, (g, u) in cases.items():
        before = g.clone()
        with torch.no_grad():
            assert _C.gate(g, u, SILU) is False, why
        assert torch.equal(g, before), why
    assert launches() == n


@pytest.mark.gpu
def test_optimize_packs_a_cuda_swiglu_and_runs_it_as_one_gemm():
    torch.manual_seed(5)
    d, f = 1024, 2816
    model = nn.Sequential(nn.LayerNorm(d), SwiGLU(d, f)).cuda().bfloat16().eval()
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    m = model[1]
    g, u = m.w1.weight, m.w3.weight
    assert packed_gate_up(g, u) is not None and m.__dict__.get("_packed")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    x = torch.randn(2, 2048, d, device="cuda").bfloat16()
    running = m.running(4096)
    if not running.startswith("runs PyTorch ops @4096"):
        pytest.fail(f"this FFN should run the eager ops at 4096 tokens: {running}")
    with torch.no_grad():
        y0 = model(x)
        n = launches()
        y1 = model(x)
        assert launches() == n + 1 and kept_fast(m).pack == 3
        h = model[0](x)
        want = one_gemm(h, torch.cat((g, u)), None, m.w2.weight, None, f, in_place=True)
        assert torch.equal(y0, want) and torch.equal(y1, want)
        torch.testing.assert_close(y1, ref(x), atol=2e-2, rtol=2e-2)
    fuser.revert(model)                        # separate memory again, the same values
    assert packed_gate_up(g, u) is None and torch.equal(g, ref[1].w1.weight)
    fuser.optimize(model)
    model.half()                               # new tensors, one per Parameter: packed again
    assert packed_gate_up(g, u) is not None and g.dtype == torch.float16
    fuser.revert(model)
    cpu = fuser.optimize(model.cpu())          # optimized on the CPU (nothing packed), then moved
    assert packed_gate_up(g, u) is None
    cpu.cuda()
    assert packed_gate_up(g, u) is not None
    model[1].unpack()
    model.bfloat16()                           # kept apart once unpacked
    assert packed_gate_up(g, u) is None

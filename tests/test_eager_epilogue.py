"""The eager route of a plain chain with a bias and ReLU or tanh GELU: its up projection, bias and activation as
one cuBLASLt GEMM with an epilogue (``torch._addmm_activation``), then the down projection (python/eager_bind.c's
lt_ffn): one launch and two passes of the intermediate fewer than linear and the activation.

On any machine: off a CUDA device the ops run, bitwise the reference (seen in the profiler's op list), and
``gate_setup`` takes torch's op or None. A plain chain that gets no epilogue runs its activation in place of the up
projection's result (one allocation fewer, the same bits) where nothing records or observes it. On a Hopper GPU (marked gpu): the epilogue runs for every input rank and
both activations, with ``_addmm_activation``'s bits and as close to the float64 FFN as the ops; the ops run where it does not
apply (exact GELU, SiLU, no bias, autograd, a torch mode, FUSER_DISABLE); ``fuser.ffn`` and ``FusedFFN`` use it. A
chain without b_up takes the epilogue over a zero bias where ``_C.zero_bias_setup`` turns that on (from 2 rows: the
bits of ``_addmm_activation`` over zeros; one row on the ops; the zeros made once per length and dtype, never while
a graph is captured)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fuser
from fuser import _C, route, runtime
from fuser.reference import ACTIVATIONS, eager
from conftest import CudaLooking, rel_error


def ops_seen(fn):
    """fn()'s result and the aten ops it ran (the profiler observes without a torch mode, so nothing declines)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = fn()
    return y, {e.key for e in prof.key_averages()}


def tensors(act_bias=True, device="cpu", dtype=torch.float32, shape=(2, 3), d=32, f=96, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)

    def r(*s):
        return (torch.randn(*s, generator=gen, device=device) / 4).to(dtype)
    x, wu, wd = r(*shape, d), r(f, d), r(d, f)
    bu, bd = (r(f), r(d)) if act_bias else (None, None)
    return x, wu, wd, bu, bd


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
def test_off_cuda_the_ops_run(act):
    x, wu, wd, bu, bd = tensors()
    y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], x, wu, wd, None, bu, None, bd))
    assert "aten::_addmm_activation" not in seen
    assert torch.equal(y, eager(x, wu, wd, None, bu, None, bd, ACTIVATIONS[act]))


def test_gate_setup_takes_torchs_op_or_none():
    args = [runtime.gate_cubin, tuple(ACTIVATIONS[a] for a in runtime.GATE_ACTS), *[len] * 7]
    none = (None,) * 4
    try:
        _C.gate_setup(*args, None, none, None)  # a torch without _addmm_activation: the ops run
        with pytest.raises(TypeError, match="argument 10 is not callable"):
            _C.gate_setup(*args, "addmm", none, None)
    finally:
        runtime.register_eager_hooks()         # the real ones again


# ---- a zero bias in place of a missing b_up ----------------------------------------------------------------

@pytest.fixture
def zero_bias_from():
    """set(min_tokens, make=runtime.zero_bias): the zero-bias epilogue's threshold and maker for this test."""
    was = _C.zero_bias_setup(runtime.zero_bias, runtime.ZERO_BIAS_MIN_TOKENS)
    yield lambda n, make=runtime.zero_bias: _C.zero_bias_setup(make, n)
    _C.zero_bias_setup(*was)


def test_zero_bias_setup_checks_its_arguments_and_gives_back_what_was_set(zero_bias_from):
    assert _C.zero_bias_info()["min_tokens"] == runtime.ZERO_BIAS_MIN_TOKENS   # registered at import
    for bad in (1, -3):
        with pytest.raises(ValueError, match="min_tokens must be 0 \\(never\\) or at least 2"):
            _C.zero_bias_setup(runtime.zero_bias, bad)
    with pytest.raises(TypeError, match="zero_bias_setup\\(make: callable or None, min_tokens: int\\)"):
        _C.zero_bias_setup("zeros", 2)
    with pytest.raises(TypeError):
        _C.zero_bias_setup(runtime.zero_bias, 2.0)
    with pytest.raises(OverflowError):
        _C.zero_bias_setup(runtime.zero_bias, 1 << 80)
    assert _C.zero_bias_setup(None, 64)[1] == runtime.ZERO_BIAS_MIN_TOKENS
    assert _C.zero_bias_setup(runtime.zero_bias, 2) == (None, 64)
    assert _C.zero_bias_info()["min_tokens"] == 2


def test_the_zero_bias_maker_gives_zeros_of_the_rows_or_none_while_capturing(monkeypatch):
    w = torch.ones(5, 3, dtype=torch.float16)
    z = runtime.zero_bias(w)
    assert z.shape == (5,) and z.dtype == torch.float16 and z.device == w.device and not z.any()
    monkeypatch.setattr(runtime, "capturing", lambda: True)
    assert runtime.zero_bias(w) is None


def test_off_cuda_a_bias_free_chain_runs_the_ops_and_makes_no_zero_bias(zero_bias_from):
    made = []
    zero_bias_from(2, lambda w: made.append(w) or runtime.zero_bias(w))
    x, wu, wd, _, _ = tensors(shape=(4, 6))
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x, wu, wd, None, None, None, None))
    assert "aten::_addmm_activation" not in seen and not made
    assert torch.equal(y, eager(x, wu, wd, None, None, None, None, ACTIVATIONS["relu"]))


@pytest.mark.parametrize("shape", [(), (1,), (2,), (1, 1, 3), (2, 7)])
@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_zero_bias_path_on_cuda_looking_cpu_tensors(shape, act, dtype, zero_bias_from):
    """The zero-bias epilogue's C path (the rows, the threshold, the kept zeros, the down projection) on the CPU's
    ``_addmm_activation``: from 2 rows the bits of ``_addmm_activation`` over zeros then linear, below the ops."""
    zero_bias_from(2)
    x, wu, wd, _, _ = tensors(act_bias=False, dtype=dtype, shape=shape, f=96 + 8 * 13, seed=7)
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], x.as_subclass(CudaLooking), wu, wd, None,
                                            None, None, None))
        ops = eager(x, wu, wd, None, None, None, None, ACTIVATIONS[act])
    assert type(y) is torch.Tensor and y.shape == ops.shape
    if x.numel() // x.shape[-1] < 2:
        assert "aten::_addmm_activation" not in seen and torch.equal(y, ops), seen
        return
    assert "aten::_addmm_activation" in seen, seen     # (on the CPU it runs its activation as relu_ / gelu_)
    assert torch.equal(y, _zero_bias_want(x, wu, wd, act))


def test_on_cuda_looking_cpu_tensors_a_zero_bias_is_made_once_per_length_and_dtype(zero_bias_from):
    made = []
    zero_bias_from(64, lambda w: made.append((w.shape[0], w.dtype, w.device.type)) or runtime.zero_bias(w))
    f = 96 + 8 * 15
    for dtype in (torch.float32, torch.bfloat16):
        for m in (32, 63, 64, 200, 64):
            x, wu, wd, _, _ = tensors(act_bias=False, dtype=dtype, shape=(m,), f=f, seed=m)
            with torch.no_grad():
                y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x.as_subclass(CudaLooking), wu,
                                                    wd, None, None, None, None))
            assert ("aten::_addmm_activation" in seen) == (m >= 64), (m, seen)
            assert torch.equal(y, _zero_bias_want(x, wu, wd, "relu") if m >= 64 else
                               eager(x, wu, wd, None, None, None, None, ACTIVATIONS["relu"]))
    assert made == [(f, torch.float32, "cpu"), (f, torch.bfloat16, "cpu")]


# ---- a plain chain's activation in place ------------------------------------------------------------------

IN_PLACE = {"relu": "aten::relu_", "gelu": "aten::gelu_", "gelu_tanh": "aten::gelu_", "silu": "aten::silu_"}
OUT_OF_PLACE = {"relu": "aten::relu", "gelu": "aten::gelu", "gelu_tanh": "aten::gelu", "silu": "aten::silu"}


@pytest.mark.parametrize("act", list(IN_PLACE))
@pytest.mark.parametrize("shape", [(5,), (2, 3), (0,)])
def test_a_plain_chains_activation_runs_in_place_with_the_ops_bits(act, shape):
    x, wu, wd, _, bd = tensors(shape=shape)
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], x, wu, wd, None, None, None, bd))
        want = eager(x, wu, wd, None, None, None, bd, ACTIVATIONS[act])
    assert IN_PLACE[act] in seen and OUT_OF_PLACE[act] not in seen, seen
    assert y.shape == want.shape and torch.equal(y, want)


def test_fuser_disable_leaves_the_in_place_activation_on(monkeypatch):
    # FUSER_DISABLE asks for PyTorch's ops: the in-place form is one, with the same bits
    monkeypatch.setenv("FUSER_DISABLE", "1")
    x, wu, wd, _, _ = tensors()
    with torch.no_grad():
        y, seen = ops_seen(lambda: fuser.ffn(x, wu, wd, activation="silu"))
    assert "aten::silu_" in seen and torch.equal(y, eager(x, wu, wd, None, None, None, None, ACTIVATIONS["silu"]))


@pytest.mark.parametrize("why", ["autograd", "autograd through x", "a dispatch mode", "not registered"])
def test_the_activation_runs_out_of_place_where_it_must(why):
    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, wu, wd, _, _ = tensors()
    act = torch.sigmoid if why == "not registered" else ACTIVATIONS["gelu"]
    if why == "autograd":
        wu.requires_grad_()
    if why == "autograd through x":
        x.requires_grad_()
    mode = Seen()

    def call():
        if why == "a dispatch mode":
            with mode:
                return _C.eager(F.linear, act, x, wu, wd, None, None, None, None)
        return _C.eager(F.linear, act, x, wu, wd, None, None, None, None)
    y, seen = ops_seen(call)
    assert not any(k.endswith("_") and k[:-1] in OUT_OF_PLACE.values() for k in seen), (why, seen)
    if why == "a dispatch mode":
        assert "aten.gelu.default" in mode.ops, mode.ops      # the mode saw the op it expects
    assert torch.equal(y, eager(x, wu, wd, None, None, None, None, act)), why
    if why.startswith("autograd"):
        y.sum().backward()                        # the ops recorded their backward
        assert (wu.grad if why == "autograd" else x.grad) is not None


def test_gate_setup_checks_the_in_place_forms():
    args = [runtime.gate_cubin, tuple(ACTIVATIONS[a] for a in runtime.GATE_ACTS), *[len] * 7, None]
    try:
        with pytest.raises(TypeError, match="acts_in_place: a tuple of 4"):
            _C.gate_setup(*args, (torch.relu_,), None)
        with pytest.raises(TypeError, match=r"acts_in_place\[2\] is neither callable nor None"):
            _C.gate_setup(*args, (None, None, "gelu_", None), None)
        _C.gate_setup(*args, (None,) * 4, None)     # none registered: the activation runs out of place
        x, wu, wd, _, _ = tensors()
        with torch.no_grad():
            _, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x, wu, wd, None, None, None, None))
        assert "aten::relu" in seen and "aten::relu_" not in seen
    finally:
        runtime.register_eager_hooks()


# ---- the epilogue, on a Hopper GPU and on CUDA-looking CPU tensors -----------------------------------------

# Each test below runs on a Hopper GPU and, for CI, on CPU tensors whose is_cuda says True (conftest.CudaLooking):
# the same C path over the CPU's _addmm_activation, which runs its activation as relu_ / gelu_ inside.
WHERE = [pytest.param("cuda", marks=pytest.mark.gpu), "cuda-looking cpu"]


def placed(where, x):
    """x as the test passes it: a CUDA tensor as it is, a CPU one as a CudaLooking."""
    return x if where == "cuda" else x.as_subclass(CudaLooking)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("shape", [(), (5,), (2, 77), (1, 1, 3), (0,), (2, 0)])
@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_epilogue_runs_with_addmm_activation_bits(shape, act, dtype, where):
    device = "cuda" if where == "cuda" else "cpu"
    x, wu, wd, bu, bd = tensors(device=device, dtype=dtype, shape=shape, d=256, f=1024, seed=1)
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], placed(where, x), wu, wd, None, bu, None,
                                            bd))
        x2 = x.reshape(-1, x.shape[-1])
        h = torch._addmm_activation(bu, x2, wu.t(), use_gelu=act == "gelu_tanh")
        want = F.linear(h, wd, bd).view(*x.shape[:-1], wd.shape[0])
        ops = eager(x, wu, wd, None, bu, None, bd, ACTIVATIONS[act])
        exact = eager(*(t.double() for t in (x, wu, wd)), None, bu.double(), None, bd.double(), ACTIVATIONS[act])
    assert "aten::_addmm_activation" in seen and (where != "cuda" or ("aten::gelu" not in seen and
                                                                    "aten::relu" not in seen)), seen
    assert type(y) is torch.Tensor and y.shape == ops.shape and torch.equal(y, want)
    # one rounding of H fewer than the ops: within the suite's bound of twice their error (bfloat16's H rounded
    # once or twice moves single outputs by a unit in the last place, more than a fixed tolerance allows)
    assert rel_error(y, exact) <= 2 * rel_error(ops, exact) + 1e-6, (rel_error(y, exact), rel_error(ops, exact))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("why", ["exact gelu", "silu", "no bias, zero bias off", "no bias, one token", "autograd",
                                 "autograd through x", "a dispatch mode", "FUSER_DISABLE"])
def test_the_ops_run_where_the_epilogue_does_not_apply(why, monkeypatch, where, zero_bias_from):
    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    act = {"exact gelu": "gelu", "silu": "silu"}.get(why, "relu")
    zero_bias_from(0 if why == "no bias, zero bias off" else 2)
    x, wu, wd, bu, bd = tensors(act_bias=not why.startswith("no bias"), device="cuda" if where == "cuda" else "cpu",
                                dtype=torch.bfloat16, shape=(1,) if why.endswith("one token") else (2, 3), d=256,
                                f=1024)
    if why == "autograd":
        wu.requires_grad_()
    if why == "autograd through x":
        x.requires_grad_()
    if why == "FUSER_DISABLE":
        monkeypatch.setenv("FUSER_DISABLE", "1")
    xp = placed(where, x)

    def call():
        if why == "a dispatch mode":
            with Seen():
                return _C.eager(F.linear, ACTIVATIONS[act], xp, wu, wd, None, bu, None, bd)
        return _C.eager(F.linear, ACTIVATIONS[act], xp, wu, wd, None, bu, None, bd)
    y, seen = ops_seen(call)
    assert "aten::_addmm_activation" not in seen, why
    assert torch.equal(y, eager(x, wu, wd, None, bu, None, bd, ACTIVATIONS[act])), why
    if why.startswith("autograd"):
        y.float().sum().backward()                # the ops recorded their backward


@pytest.mark.gpu
def test_fuser_ffn_and_an_optimized_gpt2_style_mlp_use_the_epilogue(monkeypatch, request):
    # a fast host: the chain stays on its eager route outside graphs too (a slow one could make it host-bound,
    # launched fused: tests/test_host_bound.py), whatever this machine's host costs today
    monkeypatch.setattr(runtime, "_host_op", {torch.cuda.current_device(): 1.0})
    route.forget()
    request.addfinalizer(route.forget)         # no route decided on that host cost outlives the test
    torch.manual_seed(2)
    mlp = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(3072, 768)).cuda().bfloat16().eval()
    x = torch.randn(4, 512, 768, device="cuda").bfloat16()
    ref = mlp(x)
    fused = fuser.optimize(mlp)
    running = fused.running(2048)
    if not running.startswith("runs PyTorch ops @2048"):
        pytest.fail(f"this FFN should run the eager ops at 2048 tokens: {running}")
    with torch.no_grad():
        fused(x)
        y, seen = ops_seen(lambda: fused(x))      # the kept route
        z, seen_ffn = ops_seen(lambda: fuser.ffn(x, mlp[0].weight, mlp[2].weight, b_up=mlp[0].bias,
                                                 b_down=mlp[2].bias, activation="gelu_tanh"))
    assert "aten::_addmm_activation" in seen and "aten::_addmm_activation" in seen_ffn
    assert torch.equal(y, z)
    torch.testing.assert_close(y, ref, atol=3e-2, rtol=3e-2)


def test_the_benchmark_checks_its_cells_and_says_what_it_needs():
    import os
    import subprocess
    import sys
    from fuser.tools.timing import hopper_reason
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "eager_epilogue.py")
    r = subprocess.run([sys.executable, script, "--cells", "llama3-8b:128"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is not MODEL:TOKENS with MODEL one of gpt2" in r.stderr, r.stderr
    # without biases the cells are other models' (G4: no bias), and GPT-2's (with biases) are not among them
    r = subprocess.run([sys.executable, script, "--zero-bias", "--cells", "gpt2:512"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "is not MODEL:TOKENS with MODEL one of G4" in r.stderr, r.stderr
    if hopper_reason() is None:
        return   # (on a Hopper GPU the benchmark would run)
    r = subprocess.run([sys.executable, script, "--cells", "gpt2:512"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "eager_epilogue.py needs a Hopper GPU:" in r.stderr, r.stderr


# ---- the zero bias on a Hopper GPU -----------------------------------------------------------------------

def _zero_bias_want(x, wu, wd, act):
    """torch._addmm_activation over zeros, then linear: the bits the zero-bias epilogue must give."""
    x2 = x.reshape(-1, x.shape[-1])
    zeros = torch.zeros(wu.shape[0], device=x.device, dtype=x.dtype)
    h = torch._addmm_activation(zeros, x2, wu.t(), use_gelu=act == "gelu_tanh")
    return F.linear(h, wd).view(*x.shape[:-1], wd.shape[0])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(), (1,), (2,), (1, 1, 3), (2, 77), (0,)])
@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_bias_free_chain_takes_the_epilogue_over_a_zero_bias_from_two_rows(shape, act, dtype, zero_bias_from):
    zero_bias_from(2)
    x, wu, wd, _, _ = tensors(act_bias=False, device="cuda", dtype=dtype, shape=shape, d=256, f=1024, seed=3)
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], x, wu, wd, None, None, None, None))
        ops = eager(x, wu, wd, None, None, None, None, ACTIVATIONS[act])
        exact = eager(*(t.double() for t in (x, wu, wd)), None, None, None, None, ACTIVATIONS[act])
        want = _zero_bias_want(x, wu, wd, act) if x.numel() else ops
    assert y.shape == ops.shape
    if x.numel() // x.shape[-1] < 2:        # torch would copy the bias first: the ops run
        assert "aten::_addmm_activation" not in seen and torch.equal(y, ops), seen
        return
    assert "aten::_addmm_activation" in seen and "aten::relu_" not in seen and "aten::gelu_" not in seen, seen
    assert torch.equal(y, want)
    assert rel_error(y, exact) <= 2 * rel_error(ops, exact) + 1e-6, (rel_error(y, exact), rel_error(ops, exact))


@pytest.mark.gpu
def test_the_zero_bias_is_made_once_per_length_and_dtype_from_its_threshold(zero_bias_from):
    made = []
    zero_bias_from(64, lambda w: made.append((w.shape[0], w.dtype)) or runtime.zero_bias(w))
    f = 1024 + 8 * 7            # a length no other test made a zero bias of
    for dtype in (torch.bfloat16, torch.float16):
        for m in (32, 63, 64, 200, 64):
            x, wu, wd, _, _ = tensors(act_bias=False, device="cuda", dtype=dtype, shape=(m,), d=128, f=f, seed=m)
            with torch.no_grad():
                y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x, wu, wd, None, None, None, None))
            assert ("aten::_addmm_activation" in seen) == (m >= 64), (m, seen)
            assert torch.equal(y, _zero_bias_want(x, wu, wd, "relu") if m >= 64 else
                               eager(x, wu, wd, None, None, None, None, ACTIVATIONS["relu"]))
    assert made == [(f, torch.bfloat16), (f, torch.float16)]


@pytest.mark.gpu
def test_without_a_zero_bias_from_the_maker_the_ops_run(zero_bias_from):
    zero_bias_from(2, lambda w: None)
    x, wu, wd, _, _ = tensors(act_bias=False, device="cuda", dtype=torch.bfloat16, shape=(8,), d=128, f=1024 + 8 * 9)
    with torch.no_grad():
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x, wu, wd, None, None, None, None))
    assert "aten::_addmm_activation" not in seen and "aten::relu_" in seen
    assert torch.equal(y, eager(x, wu, wd, None, None, None, None, ACTIVATIONS["relu"]))


@pytest.mark.gpu
def test_a_graph_captures_the_ops_before_a_zero_bias_is_kept_and_the_epilogue_after(zero_bias_from):
    zero_bias_from(2)
    f = 1024 + 8 * 11            # no zero bias of this length yet: the first call is inside the capture
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(96, 256, device="cuda", generator=gen).bfloat16() / 4
    wu = torch.randn(f, 256, device="cuda", generator=gen).bfloat16() / 16
    wd = torch.randn(256, f, device="cuda", generator=gen).bfloat16() / 16
    call = lambda: _C.eager(F.linear, ACTIVATIONS["relu"], x, wu, wd, None, None, None, None)  # noqa: E731
    kept = _C.zero_bias_info()["kept"]
    with torch.no_grad():
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y1 = call()
        assert _C.zero_bias_info()["kept"] == kept            # none made while capturing
        call()                                                # outside the capture: the zero bias is made
        assert _C.zero_bias_info()["kept"] == kept + 1
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            y2 = call()
        for _ in range(2):
            x.copy_(torch.randn(96, 256, device="cuda", generator=gen).bfloat16() / 4)
            g1.replay()
            g2.replay()
            torch.cuda.synchronize()
            assert torch.equal(y1, eager(x, wu, wd, None, None, None, None, ACTIVATIONS["relu"]))
            assert torch.equal(y2, _zero_bias_want(x, wu, wd, "relu"))


@pytest.mark.gpu
def test_fuser_ffn_runs_a_bias_free_relu_chain_with_the_zero_bias(zero_bias_from, monkeypatch, request):
    zero_bias_from(2)
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 2)
    monkeypatch.setattr(runtime, "_host_op", {torch.cuda.current_device(): 1.0})   # no host-bound fused launch
    route.forget()
    request.addfinalizer(route.forget)
    torch.manual_seed(5)
    x = torch.randn(128, 768, device="cuda").bfloat16()            # the paper's G4 at 128 tokens: eager
    wu = (torch.randn(3072, 768, device="cuda") / 28).bfloat16()
    wd = (torch.randn(768, 3072, device="cuda") / 55).bfloat16()
    r = fuser.ops.route(x, wu, wd, activation="relu")
    if r.fused:
        pytest.fail(f"G4 at 128 tokens should run the eager ops: {r}")
    with torch.no_grad():
        fuser.ffn(x, wu, wd, activation="relu")
        y, seen = ops_seen(lambda: fuser.ffn(x, wu, wd, activation="relu"))
    assert "aten::_addmm_activation" in seen and torch.equal(y, _zero_bias_want(x, wu, wd, "relu"))


def test_a_host_bound_route_makes_the_zero_bias_its_graphs_take_when_it_is_decided(zero_bias_from, monkeypatch):
    """A host-bound route launches the fused kernel outside graphs and runs the eager ops in them; its calls
    outside graphs never make the zero bias and a capture cannot, so the route makes it when it is decided
    (``ops._remember`` asks every route whose graphs run the eager ops to prepare). Only where the eager ops take
    the epilogue: not for an up bias, a gated chain, SiLU, too few tokens or the epilogue switched off."""
    zero_bias_from(2)
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 2)

    def host_bound(m, d, f, **kw):
        r = route.HostBoundRoute.__new__(route.HostBoundRoute)
        r.graph_plan = fuser.plan(m, d, f, fused=False, **kw)
        return r, torch.randn(f, d).bfloat16()
    for m, f, kw in ((128, 1128, dict(bias=("down",))), (128, 1136, dict(bias=True)),
                     (128, 1144, dict(gated=True)), (128, 1152, dict(activation="silu")), (1, 1160, {})):
        r, w = host_bound(m, 64, f, **dict(dict(activation="relu"), **kw))
        kept = _C.zero_bias_info()["kept"]
        r.prepare(w)
        assert _C.zero_bias_info()["kept"] == kept + (f == 1128), (m, f, kw)
    z = _C.zero_bias(torch.empty(1128, 64, dtype=torch.bfloat16))
    assert z.shape == (1128,) and z.dtype == torch.bfloat16 and not z.any()
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 0)
    r, w = host_bound(128, 64, 1168, activation="gelu_tanh")
    kept = _C.zero_bias_info()["kept"]
    r.prepare(w)
    assert _C.zero_bias_info()["kept"] == kept

    asked = []

    class Graphed:
        graphs_eager = True

        def prepare(self, w_up):
            asked.append(w_up)
    tensors = (torch.randn(4, 64), torch.randn(96, 64), torch.randn(64, 96), None, None, None, None)
    fuser.ops._remember(None, tensors, Graphed())
    fuser.ops._remember(None, tensors, route.Route())
    assert len(asked) == 1 and asked[0] is tensors[1]


@pytest.mark.gpu
def test_graphs_of_a_host_bound_relu_chain_take_the_zero_bias_epilogue(zero_bias_from, monkeypatch, request):
    """On a host slow enough that a bias-free ReLU chain the planner runs eager launches fused outside graphs, a
    graph captured after such calls runs the eager route's epilogue over the zero bias the route made when it was
    decided (before, no call outside graphs had made it, and the graph ran the three ops)."""
    zero_bias_from(2)
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 2)
    monkeypatch.setattr(runtime, "_host_op", {torch.cuda.current_device(): 50.0})   # fused outside graphs
    route.forget()
    request.addfinalizer(route.forget)
    torch.manual_seed(6)
    f = 1024 + 8 * 13                # no zero bias of this length kept before the route is decided
    x = torch.randn(128, 768, device="cuda").bfloat16()
    wu = (torch.randn(f, 768, device="cuda") / 28).bfloat16()
    wd = (torch.randn(768, f, device="cuda") / 34).bfloat16()
    kept = _C.zero_bias_info()["kept"]
    r = fuser.ops.route(x, wu, wd, activation="relu")
    if not r.graphs_eager:
        pytest.fail(f"this chain should launch fused outside graphs on a 50 us/op host: {r}")
    assert _C.zero_bias_info()["kept"] == kept + 1
    with torch.no_grad():
        fuser.ffn(x, wu, wd, activation="relu")          # outside graphs: the fused launch
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = fuser.ffn(x, wu, wd, activation="relu")
        assert _C.zero_bias_info()["kept"] == kept + 1
        x.copy_(torch.randn(128, 768, device="cuda").bfloat16())
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, _zero_bias_want(x, wu, wd, "relu"))


def test_the_planner_prices_the_eager_route_with_its_epilogue():
    """A plain 16-bit chain with ReLU or tanh GELU runs its activation in the up GEMM's epilogue from
    ``_C.EAGER_EPILOGUE_TOKENS`` rows (the runtime's zero-bias default): the model's eager prediction drops the
    activation kernel (eager_op_us for eager_epilogue_us) and H's two passes through it. Priced so, the eager
    route beats the fused picks of the paper's ReLU chains that it beat on the GPU (G6 and G9 at 128 tokens on
    an H100: 1.10-1.14x the ops, the fused picks 0.82-0.89x; G10 at 1024 tokens on the H200: 1.38x the fused
    pick), while G1, whose fused plan beats the route, stays fused (docs/planner.md, "The eager route's
    epilogue in the model")."""
    t = fuser._C.targets()["h200"]
    m, d, f = 128, 512, 2048

    def eager(act, m=m, gated=False, **target):
        return fuser.plan(m, d, f, activation=act, gated=gated, fused=False, target=dict(t, **target)).predicted_us

    h_passes = 2 * 2 * m * f / (t["hbm_gbs"] * 1e3)
    assert eager("gelu") - eager("relu") == pytest.approx(t["eager_op_us"] - t["eager_epilogue_us"] + h_passes)
    assert eager("gelu_tanh") == pytest.approx(eager("relu"))
    assert eager("relu", eager_epilogue_us=2.0) - eager("relu") == pytest.approx(2.0 - t["eager_epilogue_us"])
    one = fuser._C.EAGER_EPILOGUE_TOKENS - 1     # too few rows for the epilogue: PyTorch's three ops
    assert eager("relu", m=one) == pytest.approx(eager("gelu", m=one))
    assert eager("silu", gated=True) == pytest.approx(eager("silu", gated=True, eager_epilogue_us=9.0))
    assert fuser._C.EAGER_EPILOGUE_TOKENS == runtime.ZERO_BIAS_MIN_TOKENS
    with pytest.raises(ValueError, match="eager_epilogue_us must be >= 0"):
        fuser.plan(m, d, f, activation="relu", target=dict(t, eager_epilogue_us=-1.0))
    for target, (m, d, f) in (("h100", (128, 1024, 4096)), ("h100", (128, 512, 2048)), ("h200", (1024, 384, 1536))):
        p = fuser.plan(m, d, f, activation="relu", target=target)
        assert not p.fused and p.raw["eager_epilogue"] and "cuBLASLt epilogue" in p.explain(), (target, m, d, f)
    exact = fuser.plan(128, 1024, 4096, activation="gelu", fused=False, target="h200")
    assert not exact.raw["eager_epilogue"] and "cuBLASLt epilogue" not in exact.explain()
    assert fuser.plan(128, 32, 512, d_out=256, activation="relu", target="h200").fused

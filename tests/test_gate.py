"""The eager route's gate kernel (include/fuser/device/gate.cuh, python/gate_bind.c): a gated chain's
activation and product, act(g) * u, in one kernel in place of g, bitwise what PyTorch's two ops return.

On any machine: the kernels compile for every dtype and activation without spills, ``_C.gate`` declines what it
cannot take (CPU tensors, unknown activations), an unfused gated plan's explanation names the kernel,
``fuser.warmup`` compiles it for gated 16-bit FFNs only, and the benchmark says what it needs without a GPU. On a
Hopper GPU (marked gpu): every bfloat16 and float16 value of g against the ops, ragged lengths, everything it must
decline (autograd, strided or misaligned views, mixed dtypes, a torch mode, FUSER_DISABLE), the eager route of
``fuser.ffn`` and ``_C.eager`` using it, CUDA graphs, a first use during graph capture, and the compute-sanitizer
workload (tests/gpu/sanitize_gate.py) with its NaN guards, the benchmark's list of each variant's kernels, and a
quantized chain's PyTorch-ops route (fuser.fp8.eager) using the kernel with the same bits."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fuser
import fuser.tools.timing
from fuser import _C, jit, runtime
from fuser.reference import ACTIVATIONS, eager

ACTS = runtime.GATE_ACTS
KERNELS = {f"fuser_gate_{dt}_{a}" for dt in ("bf16", "f16") for a in ACTS}


def launches():
    return _C.gate_info()["launches"]


def ops(g, u, act):
    return ACTIVATIONS[act](g) * u


def test_the_gate_kernels_compile_for_every_dtype_and_activation():
    if not fuser.env().nvrtc_found:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc, or set $FUSER_NVRTC)")
    c = jit.compile_source(_C.gate_source(), "fuser_gate.cu")
    assert {k["name"] for k in c.kernels} == KERNELS
    assert c.spill_bytes == 0 and all(k["stack_bytes"] == 0 for k in c.kernels), c.log


def test_the_gate_declines_cpu_tensors_and_unknown_activations():
    g, u = torch.randn(4, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    before, n = g.clone(), launches()
    assert _C.gate(g, u, ACTIVATIONS["silu"]) is False
    assert _C.gate(g, u, torch.sigmoid) is False and _C.gate(g, u, "silu") is False
    assert torch.equal(g, before) and launches() == n
    with pytest.raises(TypeError, match="3 arguments"):
        _C.gate(g, u)


def test_gate_setup_checks_its_arguments():
    with pytest.raises(TypeError, match="a tuple of 4 functions"):
        _C.gate_setup(runtime.gate_cubin, (F.relu,), *[len] * 8, (None,) * 4, None)
    with pytest.raises(TypeError, match="argument 3 is not callable"):
        _C.gate_setup(runtime.gate_cubin, tuple(ACTIVATIONS[a] for a in ACTS), 1, *[len] * 7, (None,) * 4, None)


def test_the_cpu_eager_route_still_runs_the_ops():
    x, wu, wg, wd = (torch.randn(*s).bfloat16() for s in ((5, 16), (48, 16), (48, 16), (16, 48)))
    n = launches()
    y = _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, None)
    assert torch.equal(y, eager(x, wu, wd, wg, None, None, None, ACTIVATIONS["silu"])) and launches() == n


def test_an_unfused_plan_says_where_the_gate_kernel_runs():
    gated = fuser.plan(2048, 4096, 14336, gated=True, activation="silu", target="h200")
    assert not gated.fused and "gate kernel" in gated.explain()
    for other in (fuser.plan(2048, 4096, 16384, activation="gelu", target="h200"),
                  fuser.plan(64, 64, 256, gated=True, activation="silu", dtype="float32", target="h200")):
        assert not other.fused and "gate kernel" not in other.explain()


class SwiGLU(torch.nn.Module):
    def __init__(self, d=64, f=192):
        super().__init__()
        self.w1, self.w3, self.w2 = torch.nn.Linear(d, f), torch.nn.Linear(d, f), torch.nn.Linear(f, d)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def test_warmup_compiles_the_gate_kernel_for_gated_16_bit_ffns(tmp_path, monkeypatch):
    if not fuser.env().nvrtc_found:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc, or set $FUSER_NVRTC)")
    monkeypatch.setenv("FUSER_CACHE_DIR", str(tmp_path))
    lines = []
    fuser.warmup(fuser.optimize(SwiGLU().bfloat16()), tokens=16, target="h200", log=lines.append)
    assert any(line.startswith("the eager route's gate kernel: ") and ", 0 spill bytes, compiled, " in line
               for line in lines), lines
    lines.clear()
    fuser.warmup(fuser.optimize(SwiGLU().bfloat16()), tokens=16, target="h200", log=lines.append)
    assert any(line.startswith("the eager route's gate kernel: ") and "cache hit" in line for line in lines), lines
    lines.clear()
    plain = torch.nn.Sequential(torch.nn.Linear(64, 192), torch.nn.GELU(), torch.nn.Linear(192, 64))
    for model in (plain.bfloat16(), SwiGLU()):   # plain, and gated in float32: no gate kernel
        fuser.warmup(fuser.optimize(model), tokens=16, target="h200", log=lines.append)
    assert not any("gate kernel" in line for line in lines), lines


def test_the_gate_benchmark_says_what_it_needs_without_a_hopper_gpu():
    if fuser.tools.timing.hopper_reason() is None:
        pytest.skip("a Hopper GPU is present: the benchmark would run")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "eager_gate.py"), "--cells", "S8:128"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "eager_gate.py needs a Hopper GPU:" in r.stderr, r.stderr


# ---- on a Hopper GPU ----------------------------------------------------------------------------------

def every_value(dtype):
    """Every 16-bit pattern as `dtype` (NaNs and infinities included), on the GPU."""
    return torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)


def same(a, b):
    """Bitwise equal where not NaN, NaN at the same places (NaN payloads may differ)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    bits = a.view(torch.int16) == b.view(torch.int16)
    return bool(torch.equal(na, nb) and bits[~na].all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
def test_the_gate_kernel_is_bitwise_the_ops_on_every_value(dtype, act):
    g0 = every_value(dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for u in (torch.ones_like(g0), torch.randn(g0.shape, device="cuda", generator=gen).to(dtype),
              every_value(dtype).flip(0)):
        g, n = g0.clone(), launches()
        assert _C.gate(g, u, ACTIVATIONS[act]) is True and launches() == n + 1
        assert same(g, ops(g0, u, act)), (dtype, act)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5), (1023,), (4099,), (64, 14336)])
def test_the_gate_kernel_on_ragged_lengths(shape):
    gen = torch.Generator(device="cuda").manual_seed(2)
    g0, u0 = (torch.randn(shape, device="cuda", generator=gen).bfloat16() * 4 for _ in range(2))
    g, u = g0.clone(), u0.clone()
    assert _C.gate(g, u, ACTIVATIONS["silu"]) is True
    assert same(g, ops(g0, u0, "silu")) and torch.equal(u, u0)


@pytest.mark.gpu
def test_the_gate_declines_what_the_ops_must_run():
    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    g, u = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    silu = ACTIVATIONS["silu"]
    cases = {
        "requires grad": (g.clone().requires_grad_(), u),
        "strided": (g.clone().t(), u),
        "misaligned": (torch.randn(64 * 64 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(64, 64), u),
        "float32": (g.float(), u.float()),
        "mixed dtypes": (g.clone(), u.half()),
        "other shape": (g.clone(), u.reshape(32, 128)),
        "cpu": (g.cpu(), u.cpu()),
    }
    n = launches()
    for why, (a, b) in cases.items():
        before = a.detach().clone()
        with torch.no_grad() if why != "requires grad" else torch.enable_grad():
            assert _C.gate(a, b, silu) is False, why
        assert torch.equal(a.detach(), before), why
    with Seen():
        assert _C.gate(g.clone(), u, silu) is False
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FUSER_DISABLE", "1")
        assert _C.gate(g.clone(), u, silu) is False
        mp.setenv("FUSER_DISABLE", "maybe")
        with pytest.raises(ValueError, match="FUSER_DISABLE"):
            _C.gate(g.clone(), u, silu)
    assert launches() == n


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTS)
def test_the_eager_route_runs_the_gate_kernel_with_the_ops_results(act):
    gen = torch.Generator(device="cuda").manual_seed(3)
    x, wu, wg, wd = (torch.randn(*s, device="cuda", generator=gen).bfloat16() / 8
                     for s in ((77, 256), (704, 256), (704, 256), (256, 704)))
    ref = eager(x, wu, wd, wg, None, None, None, ACTIVATIONS[act])
    n = launches()
    with torch.no_grad():
        y = _C.eager(F.linear, ACTIVATIONS[act], x, wu, wd, wg, None, None, None)
        unfused = fuser.plan(77, 256, 704, gated=True, activation=act, fused=False)
        z = fuser.ffn(x, wu, wd, w_gate=wg, activation=act, plan=unfused)
    assert torch.equal(y, ref) and torch.equal(z, ref) and launches() == n + 2


@pytest.mark.gpu
def test_the_gate_benchmark_lists_each_variants_kernels():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import eager_gate
    gen = torch.Generator(device="cuda").manual_seed(5)
    x, wu, wg, wd = (torch.randn(*s, device="cuda", generator=gen).bfloat16() / 8
                     for s in ((16, 256), (704, 256), (704, 256), (256, 704)))
    silu = ACTIVATIONS["silu"]
    with torch.no_grad():
        route = eager_gate.kernels(lambda: _C.eager(F.linear, silu, x, wu, wd, wg, None, None, None))
        ref = eager_gate.kernels(lambda: eager(x, wu, wd, wg, None, None, None, silu))
    names = [n for n, _ in route]
    assert sum(n.startswith("fuser_gate_bf16_silu") for n in names) == 1, names
    assert not any(n.startswith("fuser_gate") for n, _ in ref), ref
    assert len(route) < len(ref) and all(us > 0 for _, us in route + ref), (route, ref)


@pytest.mark.gpu
def test_the_eager_route_records_autograd_with_the_ops():
    x, wu, wg, wd = (torch.randn(*s, device="cuda").bfloat16().requires_grad_() for s in
                     ((9, 64), (96, 64), (96, 64), (64, 96)))
    n = launches()
    y = _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, None)
    y.float().sum().backward()
    assert launches() == n and x.grad is not None and wg.grad is not None


@pytest.mark.gpu
def test_the_gate_kernel_replays_in_a_cuda_graph():
    x, wu, wg, wd = (torch.randn(*s, device="cuda").bfloat16() / 8 for s in ((33, 128), (352, 128), (352, 128),
                                                                             (128, 352)))
    silu = ACTIVATIONS["silu"]
    with torch.no_grad():
        _C.eager(F.linear, silu, x, wu, wd, wg, None, None, None)   # loaded before the capture
        graph, n = torch.cuda.CUDAGraph(), launches()
        with torch.cuda.graph(graph):
            y = _C.eager(F.linear, silu, x, wu, wd, wg, None, None, None)
        assert launches() == n + 1
        for _ in range(2):
            x.copy_(torch.randn_like(x) / 8)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, eager(x, wu, wd, wg, None, None, None, silu))


def _fresh_process(script):
    """Run `script` in a Python process of its own (whose gate kernel nothing has loaded yet); it prints "ok"."""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr


FIRST_USE_IN_CAPTURE = """
import torch, torch.nn.functional as F
import fuser
from fuser import _C
from fuser.reference import ACTIVATIONS, eager
x, wu, wg, wd = (torch.randn(*s, device="cuda").bfloat16() for s in ((8, 64), (96, 64), (96, 64), (64, 96)))
with torch.no_grad():
    torch.matmul(x, wu.t())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, None)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager(x, wu, wd, wg, None, None, None, ACTIVATIONS["silu"]))
    assert _C.gate_info() == {"launches": 0, "devices": {}}, _C.gate_info()
    _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, None)
    assert _C.gate_info() == {"launches": 1, "devices": {0: "ready"}}, _C.gate_info()
print("ok")
"""


@pytest.mark.gpu
def test_a_first_gated_call_inside_a_graph_capture_runs_the_ops_and_loads_nothing():
    _fresh_process(FIRST_USE_IN_CAPTURE)


def test_a_host_bound_route_makes_what_its_graphs_need_when_it_is_decided(monkeypatch):
    """A host-bound route launches the fused kernel outside graphs, so what its graphs' eager ops take would never
    be made (a capture refuses to): PyTorch's cuBLAS handles (one GEMM of two rows, with and without a bias, for
    every chain) and a gated chain's gate kernel (run once on one row of zeros, on the up weight's device and
    dtype, with the chain's activation)."""
    from fuser import route
    asked, gemms = [], []
    monkeypatch.setattr(_C, "gate", lambda g, u, act: asked.append((g, u, act)) or False)
    monkeypatch.setattr(route, "_linear", lambda x, w, b=None: gemms.append((x, w, b)) or x)

    def prepare(f, dtype="bfloat16", **kw):
        r = route.HostBoundRoute.__new__(route.HostBoundRoute)
        r.graph_plan = fuser.plan(128, 64, f, fused=False, dtype=dtype, **kw)
        r.prepare(torch.randn(f, 64).to(getattr(torch, dtype)))
    prepare(1176, gated=True, activation="silu")
    assert len(asked) == 1
    g, u, act = asked[0]
    assert act is ACTIVATIONS["silu"] and g.dtype == u.dtype == torch.bfloat16 and g.device == u.device
    assert g.shape == u.shape == (1, 8) and g.data_ptr() != u.data_ptr() and not g.any()
    prepare(1184, "float16", gated=True, activation="gelu")
    assert len(asked) == 2 and asked[1][0].dtype == torch.float16 and asked[1][2] is ACTIVATIONS["gelu"]
    prepare(1192, activation="silu")
    assert len(asked) == 2
    # every route's first GEMMs (route.prepare_thread's), with and without a bias, so that a capture on the deciding
    # thread finds PyTorch's cuBLAS handles made
    assert len(gemms) == 6 and [b is None for _, _, b in gemms] == [True, False] * 3
    assert all(x.shape == (2, 8) for x, _, _ in gemms)
    assert [x.dtype for x, _, _ in gemms] == [torch.bfloat16] * 2 + [torch.float16] * 2 + [torch.bfloat16] * 2


HOST_BOUND_GATED = """
import torch
import fuser
from fuser import _C, ops, route, runtime
from fuser.reference import ACTIVATIONS, eager
runtime.host_op_us = lambda device: 1000.0
m, d, f = 256, 1024, 3072
# the eager ops in graphs whatever this card's target picks, so that the route is host-bound
graph_plan = fuser.plan(m, d, f, gated=True, activation="silu", fused=False, packed=True)
runtime.plan_for = lambda chain, device: graph_plan
x = torch.randn(m, d, device="cuda").bfloat16()
both = (torch.randn(2 * f, d, device="cuda") / d ** 0.5).bfloat16()
wg, wu, wd = both[:f], both[f:], (torch.randn(d, f, device="cuda") / f ** 0.5).bfloat16()
with torch.no_grad():
    for _ in range(2):
        fuser.ffn(x, wu, wd, w_gate=wg, activation="silu")
    kept = [r for r in ops._routes.values() if isinstance(r, route.HostBoundRoute)]
    assert len(kept) == 1 and not kept[0].graph_plan.fused, list(ops._routes.values())
    assert _C.gate_info()["devices"] == {0: "ready"}, _C.gate_info()
    graph, n = torch.cuda.CUDAGraph(), _C.gate_info()["launches"]
    with torch.cuda.graph(graph):
        y = fuser.ffn(x, wu, wd, w_gate=wg, activation="silu")
    assert _C.gate_info()["launches"] == n + 1, _C.gate_info()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    ref = eager(*(t.double() for t in (x, wu, wd, wg)), None, None, None, ACTIVATIONS["silu"])
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
print("ok")
"""


@pytest.mark.gpu
def test_graphs_of_a_host_bound_gated_chain_take_the_gate_kernel():
    """A packed gated chain (S8's shape at 256 tokens) planned eager in graphs (pinned: the device targets of an
    H100 and an H200 pick differently there), on a host whose ops cost 1 ms: its calls outside graphs launch the
    fused kernel, and a graph captured after them, in a process whose gate kernel nothing else loaded, holds the
    gate kernel (one launch while capturing) and replays to the FFN (float64's within 1%)."""
    _fresh_process(HOST_BOUND_GATED)


HOST_BOUND_THREAD = """
import threading
import torch
import fuser
from fuser import _C, ops, route, runtime
from fuser.reference import ACTIVATIONS, eager
runtime.host_op_us = lambda device: 1000.0
m, d, f = 64, 512, 1536
graph_plan = fuser.plan(m, d, f, bias=True, activation="gelu", fused=False)
runtime.plan_for = lambda chain, device: graph_plan
x = torch.randn(m, d, device="cuda").bfloat16()
wu = (torch.randn(f, d, device="cuda") / d ** 0.5).bfloat16()
wd = (torch.randn(d, f, device="cuda") / f ** 0.5).bfloat16()
bu, bd = torch.randn(f, device="cuda").bfloat16(), torch.randn(d, device="cuda").bfloat16()
with torch.no_grad():
    fuser.ffn(x, wu, wd, b_up=bu, b_down=bd, activation="gelu")      # decided here, on the main thread
assert any(isinstance(r, route.HostBoundRoute) for r in ops._routes.values()), list(ops._routes.values())
seen = {}


def serve():
    seen["before"] = _C.thread_prepared(0)
    with torch.no_grad():
        for _ in range(3):                  # outside graphs: the fused launch (the kept route's, from the second)
            fuser.ffn(x, wu, wd, b_up=bu, b_down=bd, activation="gelu")
        seen["after"] = _C.thread_prepared(0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):      # the eager ops, on this thread's cuBLAS handles
            seen["y"] = fuser.ffn(x, wu, wd, b_up=bu, b_down=bd, activation="gelu")
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()


t = threading.Thread(target=serve)
t.start()
t.join()
assert seen.get("before") is False and seen.get("after") is True and "y" in seen, seen
ref = eager(*(v.double() for v in (x, wu, wd)), None, bu.double(), None, bd.double(), ACTIVATIONS["gelu"])
assert ((seen["y"].double() - ref).norm() / ref.norm()).item() < 1e-2
print("ok")
"""


@pytest.mark.gpu
def test_a_graph_captured_on_another_thread_than_the_host_bound_decision_runs():
    """PyTorch's cuBLAS handles are per thread: a host-bound route decided on the main thread serves a thread that
    has run no GEMM with fused launches, then that thread captures a graph of the chain (the eager ops, with
    cuBLASLt's bias epilogue). The thread's first call makes its handles (``_C.thread_prepared`` False before,
    True after), so the capture does not fail at cublasCreate, and the graph replays to the FFN (within 1%)."""
    _fresh_process(HOST_BOUND_THREAD)


@pytest.mark.gpu
def test_the_sanitizer_workload_leaves_its_guards_and_matches_the_ops():
    """tests/gpu/sanitize_gate.py (what compute-sanitizer runs on the gate kernel) passes on its own: every length,
    dtype and activation bitwise the ops, the NaN guards on both sides of g untouched."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "sanitize_gate.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("all ok"), r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 512])
def test_the_fp8_eager_route_runs_the_gate_kernel_with_the_ops_bits(tokens, monkeypatch):
    from fuser import fp8
    gen = torch.Generator(device="cuda").manual_seed(8)
    d, f = 256, 512
    wu, wg = (torch.randn(f, d, device="cuda", generator=gen) / 16 for _ in range(2))
    wd = torch.randn(d, f, device="cuda", generator=gen) / 16
    x = torch.randn(tokens, d, device="cuda", generator=gen).bfloat16()
    q = fp8.quantize_ffn(wu, wd, w_gate=wg, x_samples=x.float())
    with torch.no_grad():
        n = launches()
        y = fp8.eager(x, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation="silu")
        assert launches() == n + 1
        monkeypatch.setenv("FUSER_DISABLE", "1")   # the gate declines: PyTorch's two ops
        ops_y = fp8.eager(x, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, activation="silu")
        assert launches() == n + 1
    assert torch.equal(y, ops_y)

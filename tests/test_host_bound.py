"""Host-bound routes (fuser.route.HostBoundRoute): a chain the planner runs eager in CUDA graphs is
launched fused outside them where one launch is predicted faster than the eager ops' launches
(``runtime.host_bound``), and runs the eager ops while a graph is captured. The decision and the route's
two ways are checked here on the CPU (the launch replaced by a recorder); the GPU test is in
test_gpu_torch.py."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fuser
from fuser import _C, planner, route, runtime


def test_host_bound_compares_per_call_times_with_margins():
    # eager: 3 plain ops at 20 us of host each = 60 us per call; the kernel's 8 us is below it
    assert runtime.host_bound(7.4, 8.0, 20.0, 3)
    # the GPU's time dominates both: the planner's (graph) comparison stands
    assert not runtime.host_bound(1000.0, 1300.0, 20.0, 4)
    # a fast host (2 us per op): eager's call is its GPU time, 7.4 us, not 1.25x more than the kernel's
    assert not runtime.host_bound(7.4, 8.0, 2.0, 3)
    # the kernel at most 1.5x the eager ops' GPU time, however slow the host, where that allows more than
    # one op's host time ...
    assert runtime.host_bound(30.0, 45.0, 14.0, 8) and not runtime.host_bound(30.0, 45.1, 14.0, 8)
    # ... or at most one op's host time slower: a host running ahead loses no more than a saved launch gains
    # (G7 at 128 tokens on the H100: the route 9.1 us, the kernel 14.0, 12 us per op)
    assert runtime.host_bound(9.1, 14.0, 12.0, 2) and not runtime.host_bound(9.1, 14.0, 4.0, 8)
    assert runtime.host_bound(10.0, 20.0, 10.0, 3) and not runtime.host_bound(10.0, 20.1, 10.0, 3)
    # more launches make the eager call slower at the same host cost
    assert not runtime.host_bound(10.0, 12.0, 4.0, 2) and runtime.host_bound(10.0, 12.0, 4.0, 4)
    # the margin: eager's call 30 us (three ops); a fused call of 24 us (1.25x less) is taken, 24.1 is not
    assert runtime.host_bound(20.0, 24.0, 10.0, 3) and not runtime.host_bound(20.0, 24.1, 10.0, 3)


@pytest.mark.parametrize("chain, ops", [
    (dict(gated=False, bias_up=False, activation="gelu"), 3),          # up, GELU, down
    (dict(gated=False, bias_up=True, activation="gelu"), 3),           # exact GELU: no epilogue computes it
    (dict(gated=False, bias_up=True, activation="gelu_tanh"), 2),      # GPT-2: GELU in the up GEMM's epilogue
    (dict(gated=False, bias_up=True, activation="relu"), 2),           # OPT
    (dict(gated=False, bias_up=False, activation="relu"), 3),          # no bias, no token count: no zero bias
    (dict(gated=True, bias_up=True, activation="silu"), 4),            # up, gate, the gate kernel, down
    (dict(gated=True, bias_up=False, activation="silu", dtype="float8_e4m3fn"), 5),
])
def test_eager_ops_counts_the_eager_routes_launches(chain, ops):
    assert runtime.eager_ops({"dtype": "bfloat16", **chain}) == ops


def test_eager_ops_counts_a_zero_bias_epilogue_from_its_token_threshold(monkeypatch):
    relu = dict(gated=False, bias_up=False, activation="relu", dtype="bfloat16")
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 0)                 # off: up, ReLU, down
    assert runtime.eager_ops(dict(relu, m=128)) == 3
    monkeypatch.setattr(runtime, "ZERO_BIAS_MIN_TOKENS", 2)
    assert runtime.eager_ops(dict(relu, m=128)) == 2                        # ReLU in the up GEMM's epilogue
    assert runtime.eager_ops(dict(relu, m=1)) == 3                          # one token: torch runs no cuBLASLt
    assert runtime.eager_ops(dict(relu, m=128, activation="gelu_tanh")) == 2
    assert runtime.eager_ops(dict(relu, m=128, activation="silu")) == 3     # no epilogue computes SiLU


def test_an_epilogue_chain_is_host_bound_later_than_its_three_op_form():
    """GPT-2's FFN with biases and tanh GELU runs two launches on the eager route, exact GELU three: at a host
    cost between the two thresholds only the three-op form is launched fused outside graphs."""
    tgt = planner.default_target()
    gelu = fuser.plan(128, 768, 3072, activation="gelu", bias=True, target="h200")
    tanh = fuser.plan(128, 768, 3072, activation="gelu_tanh", bias=True, target="h200")
    assert not gelu.fused and not tanh.fused
    f = fuser.plan(128, 768, 3072, activation="gelu", bias=True, target="h200", fused=True).predicted_us
    host = 1.3 * f / 2.5          # 3 ops: 1.3 f / 2.5 * 3 = 1.56 f >= 1.25 f; 2 ops: 1.04 f < 1.25 f
    assert runtime.host_bound_fused(gelu.chain, tgt, gelu, host) is not None
    assert runtime.host_bound_fused(tanh.chain, tgt, tanh, host) is None


@pytest.mark.parametrize("host_us, expect", [(2.0, False), (20.0, True)])
def test_host_bound_fused_takes_the_planners_best_fused_plan(host_us, expect):
    """GPT-2's FFN at 128 tokens runs eager in a graph on the H200 table; with a slow host its best fused
    plan is taken outside graphs, with a fast one it is not. A 7B FFN at 2048 tokens never is."""
    tgt = planner.default_target()
    eager = fuser.plan(128, 768, 3072, target="h200")
    assert not eager.fused
    p = runtime.host_bound_fused(eager.chain, tgt, eager, host_us)
    best = fuser.plan(128, 768, 3072, target="h200", fused=True)      # what fuser.warmup compiles
    assert (p is not None) == expect and (p is None or (p.fused and p.summary() == best.summary()))
    big = fuser.plan(2048, 4096, 14336, gated=True, activation="silu", target="h200")
    assert not big.fused and runtime.host_bound_fused(big.chain, tgt, big, 100.0) is None
    odd = fuser.plan(4, 12, 20, target="h200")                         # no fused plan fits: eager everywhere
    assert runtime.host_bound_fused(odd.chain, tgt, odd, 100.0) is None


def _host_bound_route(monkeypatch):
    """A HostBoundRoute for GPT-2's FFN at 4 tokens whose fused launch is a recorder."""
    launched = []
    monkeypatch.setattr(route.FusedRoute, "run", lambda self, *a: launched.append(a) or "LAUNCHED")
    eager = fuser.plan(4, 64, 256, target="h200", fused=False)
    fused = fuser.plan(4, 64, 256, target="h200", fused=True)
    monkeypatch.setattr(runtime, "launch_for", lambda plan, device: "LAUNCH")
    return route.HostBoundRoute(fused, 0, eager), launched


def test_host_bound_route_launches_outside_graphs_and_runs_eager_in_a_capture(monkeypatch):
    r, launched = _host_bound_route(monkeypatch)
    assert r.fused and r.graphs_eager and r.graph_plan is not r.plan and "outside CUDA graphs" in repr(r)
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(4, 64), torch.randn(256, 64), torch.randn(64, 256)
    monkeypatch.setattr(route, "_capturing", lambda: False)
    assert r.run(x, w1, w2, None, None, None, None, "gelu") == "LAUNCHED" and len(launched) == 1
    monkeypatch.setattr(route, "_capturing", lambda: True)
    y = r.run(x, w1, w2, None, None, None, None, "gelu")
    torch.testing.assert_close(y, fuser.ffn_reference(x, w1, w2, activation="gelu"))
    assert len(launched) == 1                                   # the capture ran the eager ops


def test_a_host_bound_route_makes_each_threads_cublas_handles_before_its_first_launch(monkeypatch):
    """PyTorch keeps its cuBLAS handles per thread and makes them at a thread's first GEMM, which a capture refuses:
    a host-bound route launches the fused kernel outside graphs, so on every thread it serves, its first call
    outside a capture makes them (``route.prepare_thread``) before launching; a later call there does not."""
    r, launched = _host_bound_route(monkeypatch)
    made = []
    monkeypatch.setattr(route, "prepare_thread", lambda t: made.append(t) or _C.thread_prepared(0, True))
    monkeypatch.setattr(route, "_capturing", lambda: False)
    x, w1, w2 = torch.randn(4, 64), torch.randn(256, 64), torch.randn(64, 256)

    def calls():
        return [r.run(x, w1, w2, None, None, None, None, "gelu") for _ in range(3)]

    def on_a_new_thread():
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(calls).result()
    assert on_a_new_thread() == ["LAUNCHED"] * 3 and len(made) == 1 and made[0] is x
    assert on_a_new_thread() == ["LAUNCHED"] * 3 and len(made) == 2 and len(launched) == 6


def test_prepare_thread_runs_a_gemm_of_two_rows_with_and_without_a_bias(monkeypatch):
    """PyTorch's cuBLASLt path (a GEMM with a bias) takes no single-row input, so the handles are made with two."""
    gemms = []
    monkeypatch.setattr(route, "_linear", lambda x, w, b=None: gemms.append((x, w, b)) or x)
    route.prepare_thread(torch.ones(3, 5, dtype=torch.float16))
    assert [(tuple(x.shape), tuple(w.shape), b is None) for x, w, b in gemms] == [((2, 8), (8, 8), True),
                                                                                   ((2, 8), (8, 8), False)]
    assert all(x.dtype == torch.float16 and not x.any() for x, _, _ in gemms) and tuple(gemms[1][2].shape) == (8,)


def test_route_for_gives_host_bound_routes_where_the_decision_says_so(monkeypatch):
    """route_for asks runtime.host_bound_plan only where the graph plan is eager, and keeps its answer
    per chain and device like every route."""
    eager = fuser.plan(128, 768, 3072, target="h200")
    fused = fuser.plan(128, 768, 3072, target="h200", fused=True)
    asked = []
    monkeypatch.setattr(runtime, "fused_available", lambda device: (True, ""))
    monkeypatch.setattr(runtime, "plan_for", lambda chain, device: eager)
    monkeypatch.setattr(runtime, "launch_for", lambda plan, device: "LAUNCH")
    monkeypatch.setattr(runtime, "host_op_us", lambda device: 20.0)
    chain = dict(eager.chain, device="cuda", device_id=0, m=128)
    try:
        route.forget()
        monkeypatch.setattr(runtime, "host_bound_plan", lambda c, d, p, h: asked.append((p, h)) or fused)
        r = route.route_for(chain)
        assert isinstance(r, route.HostBoundRoute) and r.plan is fused and r.graph_plan is eager
        assert route.route_for(chain) is r and asked == [(eager, 20.0)]   # the host's cost read once
        route.forget()
        monkeypatch.setattr(runtime, "host_bound_plan", lambda c, d, p, h: None)
        r2 = route.route_for(chain)
        assert type(r2) is route.Route and not r2.fused and r.stale and not r2.stale
        # nothing measurable now (a capture, a torch mode): the eager ops, stale at once, nothing kept
        route.forget()
        monkeypatch.setattr(runtime, "host_op_us", lambda device: None)
        r3 = route.route_for(chain)
        assert type(r3) is route.Route and r3.stale and route.route_for(chain) is not r3
        monkeypatch.setattr(runtime, "host_op_us", lambda device: 20.0)
        monkeypatch.setattr(runtime, "host_bound_plan", lambda c, d, p, h: fused)
        assert isinstance(route.route_for(chain), route.HostBoundRoute)
    finally:
        route.forget()


def test_nothing_is_measured_while_a_graph_is_captured_or_a_mode_is_active(monkeypatch):
    """host_op_us launches ops to time them: never into a CUDA graph being captured, nor under a torch
    dispatch or function mode (a FLOP counter, a tracer), which would see them; it answers None there and
    keeps nothing, so the next call outside decides."""
    from torch.utils._python_dispatch import TorchDispatchMode
    launched = []
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: launched.append(1))
    monkeypatch.setattr(runtime, "_host_op", {})
    monkeypatch.setattr(runtime, "capturing", lambda: True)
    assert runtime.host_op_us(0) is None
    monkeypatch.setattr(runtime, "capturing", lambda: False)

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        assert runtime.host_op_us(0) is None
    with torch.overrides.TorchFunctionMode():
        assert runtime.host_op_us(0) is None
    assert launched == [] and runtime._host_op == {}

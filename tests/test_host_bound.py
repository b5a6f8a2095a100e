"""Host-bound routes (fuser.route.HostBoundRoute): a chain the planner runs eager in CUDA graphs is
launched fused outside them where one launch is predicted faster than the eager ops' launches
(``runtime.host_bound``), and runs the eager ops while a graph is captured. The decision and the route's
two ways are checked here on the CPU (the launch replaced by a recorder); the GPU test is in
test_gpu_torch.py."""
import pytest
import torch

import fuser
from fuser import planner, route, runtime


def test_host_bound_compares_per_call_times_with_margins():
    # eager: 3 plain ops at 20 us of host each = 60 us per call; the kernel's 8 us is below it
    assert runtime.host_bound(7.4, 8.0, 20.0, False)
    # the GPU's time dominates both: the planner's (graph) comparison stands
    assert not runtime.host_bound(1000.0, 1300.0, 20.0, True)
    # a fast host (2 us per op): eager's call is its GPU time, 7.4 us, not 1.25x more than the kernel's
    assert not runtime.host_bound(7.4, 8.0, 2.0, False)
    # the kernel at most 1.5x the eager ops' GPU time, however slow the host
    assert runtime.host_bound(10.0, 15.0, 100.0, False) and not runtime.host_bound(10.0, 15.1, 100.0, False)
    # gated chains launch five ops: the same host cost makes their eager call slower
    assert not runtime.host_bound(10.0, 12.0, 3.0, False) and runtime.host_bound(10.0, 12.0, 3.0, True)
    # the margin: eager's call 30 us (three ops); a fused call of 24 us (1.25x less) is taken, 24.1 is not
    assert runtime.host_bound(20.0, 24.0, 10.0, False) and not runtime.host_bound(20.0, 24.1, 10.0, False)


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

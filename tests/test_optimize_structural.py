"""fuser.optimize on FFNs recognised by structure (nn.Sequential, any module whose forward traces to a
plain or gated FFN of its children), what it must refuse, FusedFFN itself, revert, and bad input."""
import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fuser
from fuser.module import FusedFFN


class Gated(nn.Module):
    """A user's own SwiGLU block: recognised by what its forward does, not by its name."""

    def __init__(self, d=32, f=96, act=F.silu, bias=False):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias)
        self.w2 = nn.Linear(f, d, bias=bias)
        self.act = act

    def forward(self, x):
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class UpTimesAct(Gated):
    """Operands of the product the other way round, activation as a module."""

    def __init__(self):
        super().__init__(act=None)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.w2(self.w3(x) * self.act(self.w1(x)))


class Scaled(Gated):
    """Not an FFN fuser computes: the output is scaled."""

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x)) * 0.5


class Block(nn.Module):
    def __init__(self, ffn):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.ffn = ffn

    def forward(self, x):
        return x + self.ffn(self.norm(x))


def seq(act=None, *, drop=None, post=None, bias=True):
    layers = [nn.Linear(32, 96, bias=bias), act if act is not None else nn.GELU()]
    if drop is not None:
        layers.append(nn.Dropout(drop))
    layers.append(nn.Linear(96, 32, bias=bias))
    if post is not None:
        layers.append(nn.Dropout(post))
    return nn.Sequential(*layers)


def same_after_optimize(model, op_calls, x=None):
    torch.manual_seed(0)
    model.eval()
    ref = copy.deepcopy(model)
    model = fuser.optimize(model)
    x = torch.randn(3, 4, 32) if x is None else x
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    assert op_calls
    return model


@pytest.mark.parametrize("act,name", [
    (nn.ReLU(), "relu"), (nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"), (nn.SiLU(), "silu")])
def test_sequential_each_activation(act, name, op_calls):
    model = same_after_optimize(Block(seq(act)), op_calls)
    assert isinstance(model.ffn, FusedFFN) and model.ffn.spec.activation == name and set(op_calls) == {name}


@pytest.mark.parametrize("kw", [dict(drop=0.0), dict(drop=0.3), dict(post=0.1), dict(bias=False)])
def test_sequential_dropouts_and_no_bias(kw, op_calls):
    model = same_after_optimize(Block(seq(**kw)), op_calls)
    assert isinstance(model.ffn, FusedFFN)


@pytest.mark.parametrize("make,act", [(Gated, "silu"), (lambda: Gated(act=F.gelu, bias=True), "gelu"),
                                      (lambda: Gated(act=functools.partial(F.gelu, approximate="tanh")), "gelu_tanh"),
                                      (UpTimesAct, "gelu_tanh")])
def test_gated_module_recognised_by_its_forward(make, act, op_calls):
    model = same_after_optimize(Block(make()), op_calls)
    assert isinstance(model.ffn, FusedFFN) and model.ffn.spec.gated and model.ffn.spec.activation == act
    assert model.ffn.weights()["gate"] is model.ffn.w1.weight


def test_module_doing_more_than_an_ffn_is_not_touched():
    model = Block(Scaled())
    assert len(fuser.report(model)) == 0
    fuser.optimize(model)
    assert isinstance(model.ffn, Scaled)


def test_gated_with_unsupported_activation_is_skipped():
    model = Block(Gated(act=torch.tanh))
    r = fuser.report(model)
    assert r[0].status == "skipped" and "tanh" in r[0].detail


@pytest.mark.parametrize("make,reason", [
    (lambda: seq(nn.Mish()), "activation Mish is not one fuser supports"),
    (lambda: seq(nn.GELU()).double(), "torch.float64"),
    (lambda: seq(drop=0.2).train(), "dropout '2' (p=0.2) between the GEMMs is active in training mode"),
], ids=["mish", "float64", "train-dropout"])
def test_refused_with_reason(make, reason):
    model = nn.ModuleDict({"ffn": make()})
    fuser.optimize(model)
    r = fuser.report(model)
    assert [e.status for e in r] == ["skipped"] and reason in r[0].detail, str(r)
    assert not isinstance(model["ffn"], FusedFFN)


def test_linear_subclass_is_refused():
    class LoRALinear(nn.Linear):
        pass

    model = nn.ModuleDict({"ffn": nn.Sequential(LoRALinear(32, 96), nn.ReLU(), nn.Linear(96, 32))})
    r = fuser.report(model)
    assert r[0].status == "skipped" and "LoRALinear" in r[0].detail


def test_optimize_is_idempotent_and_revert_restores(op_calls):
    model = Block(seq())
    first = fuser.optimize(model).ffn
    assert fuser.optimize(model).ffn is first
    assert [e.status for e in fuser.report(model)] == ["swapped"]
    fuser.revert(model)
    assert type(model.ffn) is nn.Sequential and fuser.report(model)[0].status == "fusible"


def test_model_that_is_one_ffn_returns_its_replacement(op_calls):
    mlp = seq()
    out = fuser.optimize(mlp)
    assert isinstance(out, FusedFFN) and out.get_submodule("0") is mlp[0]


def test_non_module_raises_type_error():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got dict"):
        fuser.optimize({"w": torch.ones(2)})
    with pytest.raises(TypeError):
        fuser.report(42)
    with pytest.raises(TypeError):
        FusedFFN.from_module("mlp")


def test_from_module_says_why_not():
    with pytest.raises(ValueError, match="not an FFN fuser recognises"):
        FusedFFN.from_module(nn.LayerNorm(4))
    with pytest.raises(ValueError, match="activation Tanh is not one fuser supports"):
        FusedFFN.from_module(seq(nn.Tanh()))


def test_repr_and_plan_summary():
    f = FusedFFN.from_module(Gated())
    s = f.plan_summary()
    assert s.startswith("FFN 32 -> 96 -> 32, gated, activation=silu, dtype=float32, bias=none")
    assert s in repr(f) and "w1" in repr(f)


def test_plan_summary_shows_the_planners_choice_at_128_tokens(monkeypatch):
    f = FusedFFN.from_module(Gated(d=64, f=256, bias=True)).bfloat16()
    want = fuser.plan(128, 64, 256, gated=True, activation="silu", bias=True, dtype="bfloat16")
    s = f.plan_summary()
    assert s == ("FFN 64 -> 256 -> 64, gated, activation=silu, dtype=bfloat16, bias=up+gate+down; plan @128 tokens: "
                 + want.summary())
    assert s in repr(f) and f.plan(128).chain == want.chain
    calls = []
    real = fuser.planner.plan
    monkeypatch.setattr(fuser.planner, "plan", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    assert f.plan_summary() == s and repr(f) and calls == []       # kept on the module
    f.half()                                                         # a new dtype is a new plan
    assert "dtype=float16" in f.plan_summary() and calls == [(128,)]
    assert f.plan(128).chain["dtype"] == "float16"


def test_plan_args_name_the_biases_present():
    mlp = nn.Sequential(nn.Linear(64, 256, bias=True), nn.ReLU(), nn.Linear(256, 64, bias=False)).bfloat16()
    f = FusedFFN.from_module(mlp)
    assert f.plan_args()["bias"] == ("up",)
    c = f.plan(16).chain
    assert (c["bias_up"], c["bias_gate"], c["bias_down"]) == (True, False, False)
    assert "bias=up;" in f.plan_summary()


def test_float32_ffn_says_unfused_without_planning(monkeypatch):
    monkeypatch.setattr(fuser.planner, "plan", None)   # never called
    s = FusedFFN.from_module(Gated()).plan_summary()
    assert s.endswith("; plan: float32: unfused (PyTorch eager ops)")


def test_x_of_any_leading_shape_and_non_contiguous(op_calls):
    f = FusedFFN.from_module(seq(nn.SiLU()))
    for x in (torch.randn(32), torch.randn(5, 32), torch.randn(2, 3, 4, 32), torch.randn(32, 6).t()):
        with torch.no_grad():
            torch.testing.assert_close(f(x), f.source(x), rtol=1e-5, atol=1e-5)


def test_autocast_and_dtype_mismatch_fall_back_to_pytorch(op_calls):
    f = FusedFFN.from_module(seq(nn.GELU()))
    x = torch.randn(4, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = f(x), f.source(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16 and not op_calls
    torch.testing.assert_close(y, y_ref)


def test_state_dict_keys_kept_and_bf16_model(op_calls):
    model = Block(seq()).to(torch.bfloat16)
    keys = list(model.state_dict())
    fuser.optimize(model)
    assert list(model.state_dict()) == keys
    x = torch.randn(2, 32, dtype=torch.bfloat16)
    assert model(x).dtype == torch.bfloat16 and op_calls == ["gelu"]


def test_eager_skips_validation_once_a_shape_is_known_to_take_the_reference(op_calls):
    """In eager mode a shape is routed once (validated, and its route decided); a shape whose route is the
    PyTorch ops (always so on CPU) then runs those ops directly, giving the same result. A new shape, or
    a different layout of the same shape, is routed again, so bad input still raises the clear errors."""
    torch.manual_seed(0)
    f = FusedFFN.from_module(seq(nn.SiLU())).bfloat16().eval()
    x = torch.randn(3, 4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        ys = [f(x) for _ in range(3)]
        assert op_calls == ["silu"]
        for y in ys:
            torch.testing.assert_close(y, f.source(x), rtol=0, atol=0)
        f(torch.randn(5, 32, dtype=torch.bfloat16))
        f(torch.randn(32, 12, dtype=torch.bfloat16).t())       # same shape as above, not contiguous
        assert len(op_calls) == 3
        with pytest.raises(ValueError, match="x"):
            f(torch.randn(3, 4, 31, dtype=torch.bfloat16))


@pytest.mark.no_gpu
def test_a_kept_route_turns_stale_when_plans_are_forgotten(op_calls):
    """fuser.tune and calibrate drop the plans and routes this process keeps (fuser.route.forget): the
    routes decided for CUDA chains turn stale, and a module keeping a stale route routes its next call
    again. (On this machine a CUDA chain has no fused path: its route is the eager ops.)"""
    from fuser import _C, route
    w_up, w_down = torch.randn(96, 32, dtype=torch.bfloat16), torch.randn(32, 96, dtype=torch.bfloat16)
    chain = dict(_C.ffn_check(torch.randn(4, 32, dtype=torch.bfloat16), w_up, w_down), device="cuda", device_id=0)
    r = route.route_for(chain)
    assert not r.fused and not r.stale and route.route_for(chain) is r
    route.forget()
    assert r.stale and route.route_for(chain) is not r
    f = FusedFFN.from_module(seq(nn.ReLU())).bfloat16().eval()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        f(x)
        kept = f.__dict__["_kept"]
        kept.route = r                          # as if it had been kept from a CUDA chain before forget()
        kept.fast = kept.fast._replace(route=r)   # (the fields C reads: the same route)
        f(x)
        assert op_calls == ["relu"] * 2 and f.__dict__["_kept"] is not kept
        f(x)
    assert op_calls == ["relu"] * 2


def test_compiled_graph_keeps_the_op_after_eager_remembered_the_route(op_calls):
    f = FusedFFN.from_module(seq(nn.GELU())).bfloat16().eval()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        f(x)
        f(x)
        assert op_calls == ["gelu"]
        y = torch.compile(f, backend="eager", fullgraph=True)(x)
    assert op_calls == ["gelu", "gelu"]
    torch.testing.assert_close(y, f.source(x), rtol=0, atol=0)


def test_route_names_the_calls_that_never_fuse():
    import fuser.ops
    from fuser import _C
    from fuser.route import route_for
    w_up, w_down = torch.randn(96, 32, dtype=torch.bfloat16), torch.randn(32, 96, dtype=torch.bfloat16)
    r = fuser.ops.route(torch.randn(4, 32, dtype=torch.bfloat16), w_up, w_down, activation="gelu")   # CPU
    assert not r.fused and r.plan is None and r is fuser.ops.route(torch.randn(4, 32, dtype=torch.bfloat16), w_up,
                                                                   w_down, activation="gelu")
    chain = _C.ffn_check(torch.randn(0, 32, dtype=torch.bfloat16), w_up, w_down)
    assert not route_for(chain).fused                                                                 # no tokens


def count_op_calls(monkeypatch):
    """A list that gets an entry for every call of ``torch.ops.fuser.ffn`` (the operator still runs, and
    its overloads stay reachable for the dispatcher)."""
    calls = []
    real = torch.ops.fuser.ffn

    class Counted:
        def __call__(self, *a):
            calls.append(1)
            return real(*a)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(torch.ops.fuser, "ffn", Counted())
    return calls


def test_an_eager_route_is_run_and_kept_by_the_module_and_the_op_sees_the_rest(op_calls, monkeypatch):
    """Without a dispatch mode or tracing, FusedFFN routes a call itself (no dispatcher) and keeps the
    route for the shape's later calls. On an eager route that holds under autograd too: the eager ops
    record their own backward, as the module it replaced did (the op's Function would add its
    dispatcher and Python hops to every call). A dispatch mode sees the call through
    torch.ops.fuser.ffn."""
    from torch.utils.flop_counter import FlopCounterMode
    dispatched = count_op_calls(monkeypatch)
    f = FusedFFN.from_module(seq(nn.ReLU())).bfloat16()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad(), FlopCounterMode(display=False):
        f(x)
    assert dispatched == [1] and op_calls == ["relu"] and "_kept" not in f.__dict__
    y = f(x)                                   # parameters require grad: routed here, recorded by the ops
    assert dispatched == [1] and op_calls == ["relu"] * 2 and y.grad_fn is not None and "_kept" in f.__dict__
    y.float().sum().backward()
    grad = f.get_submodule("0").weight.grad.clone()
    f.zero_grad()
    f.source(x).float().sum().backward()       # the same gradient as the module it replaced
    torch.testing.assert_close(f.get_submodule("0").weight.grad, grad, rtol=0, atol=0)
    with torch.no_grad():
        y = f(x)                               # the kept route, no dispatcher
    assert dispatched == [1] and op_calls == ["relu"] * 2
    torch.testing.assert_close(y, f.source(x), rtol=0, atol=0)
    y = f(x)                                   # the kept eager route, under autograd
    assert dispatched == [1] and op_calls == ["relu"] * 2 and y.grad_fn is not None


def test_a_fused_route_under_autograd_runs_the_eager_ops_and_keeps_no_launch(monkeypatch):
    """A fused route cannot record autograd (the kernel has no backward): under autograd FusedFFN runs
    the route, which computes with the eager ops (recording their own backward, as the replaced module
    did), without the operator's dispatcher, and keeps no launch from that call. The route here is a
    FusedRoute that never launches (a CPU machine has no kernel to load)."""
    import fuser.ops
    from fuser.route import FusedRoute
    fused = object.__new__(FusedRoute)
    fused.plan, fused.stale, fused.device, fused.launch, fused.prepared = None, False, 0, None, {}
    monkeypatch.setattr(fuser.ops, "route", lambda *a, **k: fused)
    dispatched = count_op_calls(monkeypatch)
    f = FusedFFN.from_module(seq(nn.SiLU()))
    x = torch.randn(5, 32)
    y = f(x)
    assert dispatched == [] and y.grad_fn is not None and "_kept" not in f.__dict__
    y.square().sum().backward()
    got = {n: p.grad.clone() for n, p in f.named_parameters()}
    f.zero_grad()
    f.source(x).square().sum().backward()
    for n, p in f.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-6, atol=1e-6)

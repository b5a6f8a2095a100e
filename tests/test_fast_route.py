"""FusedFFN's kept eager route (fuser/module.py): after a shape's first call, later calls skip re-reading
the weights and the route lookup, yet every change a user can make is seen: weights updated in place,
`.data` replaced, a new Parameter, a new shape, autograd. (The kept fused launch needs a Hopper GPU:
tests/test_gpu_torch.py.)"""
import copy
import inspect
import os
import sys
import types

import pytest
import torch
from torch import nn

import fuser
from fuser.module import FusedFFN
from models import hf


@pytest.fixture(params=["exchange", "no exchange"])
def exchange(request):
    """The kept routes' checks both ways: in one C call through torch's DLPack C exchange API
    (``_C.kept_match``), and in Python (a torch without that API)."""
    from fuser import _C, interop
    if request.param == "exchange" and _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API")
    interop.register(exchange=request.param == "exchange")
    yield request.param == "exchange"
    interop.register()


def kept_eager(module):
    """The route `module` keeps for its last input shape, checked to be the eager ops."""
    kept = module.__dict__["_kept"]
    assert not kept.route.fused
    return kept


def reference(module, x):
    w = module.weights()
    return fuser.ffn_reference(x, w["up"], w["down"], w_gate=w["gate"], b_up=w["b_up"], b_gate=w["b_gate"],
                               b_down=w["b_down"], activation=module.spec.activation)


def test_second_call_keeps_the_route_and_sees_every_weight_change(exchange):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16))
    m = FusedFFN.from_module(mlp)
    x = torch.randn(5, 16)
    with torch.no_grad():
        m(x)
        torch.testing.assert_close(m(x), reference(m, x))
        kept = kept_eager(m)
        assert (kept.signature is not None) == exchange              # checked in C, or here
        mlp[0].weight.mul_(-2)                                       # in place: the kept route sees it
        torch.testing.assert_close(m(x), reference(m, x))
        assert m.__dict__["_kept"] is kept
        mlp[2].weight.data = torch.randn(16, 48)                     # .data replaced: the ops read it
        torch.testing.assert_close(m(x), reference(m, x))
        assert m.__dict__["_kept"] is kept
        mlp[2].weight.data = torch.randn(16, 24)                     # another shape: the ops refuse it,
        with pytest.raises(RuntimeError, match="shape"):             # as the module replaced does
            m(x)
        with pytest.raises(RuntimeError, match="shape"):
            mlp(x)
        mlp[2].weight.data = torch.randn(16, 48)
    mlp[2].bias = nn.Parameter(torch.randn(16))                      # a new Parameter: rebuilt
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference(m, x))
        x2 = torch.randn(2, 3, 16)                                   # a new shape: the general route
        torch.testing.assert_close(m(x2), reference(m, x2))
    y = m(x)                                                         # autograd through the kept route
    y.sum().backward()
    assert mlp[0].weight.grad is not None and mlp[0].weight.grad.abs().sum() > 0


def test_sliced_gate_up_weight_replaced_is_seen(exchange):
    """Phi-3 keeps gate and up in one Parameter, sliced by rows at every general call: the kept slices
    would be stale views if the Parameter's data were replaced, so the address is checked (in C: x and the
    two sliced rows read through the exchange API at each call, not the whole down weight)."""
    model, inputs = hf("phi3")
    model.eval()
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    mlp = next(mod for mod in model.modules() if isinstance(mod, FusedFFN))
    x = torch.randn(3, mlp.spec.d_model)
    with torch.no_grad():
        mlp(x)
        mlp(x)
        kept_eager(mlp)
        if exchange:
            from fuser import _C
            before = _C.tensor_intake()["exchanged"]
            mlp(x)
            assert _C.tensor_intake()["exchanged"] - before == 3
        gu = mlp.get_submodule("gate_up_proj").weight
        gu.data = torch.randn_like(gu) * 0.1
        torch.testing.assert_close(mlp(x), reference(mlp, x))
        assert not torch.allclose(model(**inputs).logits, ref(**inputs).logits)   # the new weights were used


def test_kept_route_is_not_used_while_compiling():
    """Under torch.compile the op stays in the graph: the kept route is not consulted (no guard on it)."""
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(16, 48), nn.SiLU(), nn.Linear(48, 16))).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        m(x)
        m(x)
        kept_eager(m)
        from torch._dynamo.utils import counters
        counters.clear()
        y = torch.compile(m, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(y, reference(m, x))
    assert not counters["graph_break"]


@pytest.mark.parametrize("bad", [None, "string"])
def test_kept_route_declines_what_the_general_route_must_judge(bad, exchange):
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8)))
    with torch.no_grad():
        m(torch.randn(2, 8))
    assert kept_eager(m).run(m, bad) is None


# ---- the eager ops and the kept eager route in C (python/eager_bind.c) ----------------------------------

@pytest.mark.parametrize("gated,bias,act", [(False, False, "relu"), (True, True, "silu"), (False, True, "gelu_tanh")])
def test_eager_ops_in_c_are_the_reference_ops_bitwise_with_the_same_gradients(gated, bias, act):
    from fuser import _C
    from fuser.reference import ACTIVATIONS, eager
    torch.manual_seed(0)
    d, f = 16, 40
    t = dict(x=torch.randn(2, 3, d), w_up=torch.randn(f, d), w_down=torch.randn(d, f),
             w_gate=torch.randn(f, d) if gated else None, b_up=torch.randn(f) if bias else None,
             b_gate=torch.randn(f) if gated and bias else None, b_down=torch.randn(d) if bias else None)
    order = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")
    grads = []
    for run in (lambda *a: eager(*a, ACTIVATIONS[act]),
                lambda *a: _C.eager(torch.nn.functional.linear, ACTIVATIONS[act], *a)):
        ts = {k: None if v is None else v.clone().requires_grad_() for k, v in t.items()}
        y = run(*(ts[k] for k in order))
        y.square().sum().backward()
        grads.append((y.detach(), [ts[k].grad for k in order if ts[k] is not None]))
    (y0, g0), (y1, g1) = grads
    assert torch.equal(y0, y1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    with pytest.raises(TypeError, match="9, 10, 12 or 13 arguments"):
        _C.eager(torch.nn.functional.linear, ACTIVATIONS[act], t["x"])


def _fuser_frames(m, x):
    """m(x) under no_grad, and the names of the Python functions of fuser's package that it ran, in order."""
    import fuser.module as fm
    here, frames = os.path.dirname(fm.__file__), []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(here):
            frames.append(frame.f_code.co_name)
    with torch.no_grad():
        sys.setprofile(profile)
        try:
            y = m(x)
        finally:
            sys.setprofile(None)
    return y, frames


def test_kept_eager_route_runs_checks_and_ops_in_one_c_call(monkeypatch, exchange):
    """With the exchange API, a kept eager route's call m(x) runs in C from FusedFFN's call slot: no Python frame
    of fuser's runs (not FusedFFN.__call__, not the Python ops); without it, __call__ runs the route's checks and
    ops in Python. FusedFFN.__call__ itself stays the Python function (what torch.compile traces)."""
    import fuser.module as fm
    m, x = _kept_module(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))
    py_ops = []
    real_py = fm.eager
    monkeypatch.setattr(fm, "eager", lambda *a: py_ops.append(1) or real_py(*a))
    y, frames = _fuser_frames(m, x)
    assert torch.equal(y, reference(m, x))
    if exchange:
        assert (frames, py_ops) == ([], [])
    else:
        assert "__call__" in frames and py_ops == [1]
    assert isinstance(inspect.getattr_static(fm.FusedFFN, "__call__"), types.FunctionType)


def test_the_call_slot_leaves_calls_while_compiling_to_python(monkeypatch, exchange):
    """While torch compiles or exports (torch.compiler.is_compiling(), whose flag the C call slot reads), m(x) is
    FusedFFN.__call__'s, which hands it to nn.Module.__call__ and so to forward, as before the slot existed."""
    m, x = _kept_module(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True, raising=False)
    y, frames = _fuser_frames(m, x)
    assert torch.equal(y, reference(m, x))
    assert frames[:1] == ["__call__"] and "forward" in frames


def test_the_call_slot_sends_declined_calls_to_module_call_once(exchange):
    """A call the kept eager route declines (another shape) goes from the C call slot straight to
    nn.Module.__call__ and forward, the route's checks not run again through FusedFFN.__call__; a module whose
    route could not be kept (its `_kept` None) is called as FusedFFN.__call__ calls it."""
    m, x = _kept_module(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))
    x2 = torch.randn(2, 3, 8)
    y, frames = _fuser_frames(m, x2)
    assert torch.equal(y, reference(m, x2))
    assert "forward" in frames and ("__call__" not in frames if exchange else frames[0] == "__call__")
    m.__dict__["_kept"] = None
    y, frames = _fuser_frames(m, x)
    assert torch.equal(y, reference(m, x)) and "forward" in frames


def test_subclasses_get_the_call_slot_unless_they_define_their_own_call(exchange):
    """A subclass of FusedFFN whose __call__ is FusedFFN's gets the C call slot (no Python frame of fuser's for a
    kept route's call, with exchange); one that defines __call__, or inherits another class's, runs that one,
    which may reach FusedFFN's through super()."""
    class Plain(FusedFFN):
        pass

    class Doubled(FusedFFN):
        def __call__(self, x):
            return 2 * super().__call__(x)

    class StillDoubled(Doubled):
        pass

    for cls in (Plain, Doubled, StillDoubled):
        torch.manual_seed(0)
        m = cls.from_module(nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))).eval()
        x = torch.randn(4, 8)
        with torch.no_grad():
            m(x)
        y, frames = _fuser_frames(m, x)
        want = reference(m, x)
        if cls is Plain:
            assert torch.equal(y, want) and (frames == [] if exchange else "__call__" in frames)
        else:
            assert torch.equal(y, 2 * want) and "__call__" in frames


def _declined(how, m, x):
    """Whether ``_C.kept_eager`` declines m's call with x after `how` changed what it must check."""
    from fuser import _C
    from fuser.route import Route
    kept = kept_eager(m)
    d, fast = dict(m.__dict__), kept.fast
    if how == "stale route":
        stale = Route()
        stale.stale = True
        fast = fast._replace(route=stale)
    elif how == "own training forward":
        fast = fast._replace(train_source=True)
        d["training"] = True
    elif how == "compiled call":
        d["_compiled_call_impl"] = object()
    elif how == "backward hook":
        d["_backward_hooks"] = {0: print}
    elif how == "traced by torch.jit":
        fast = fast._replace(tracing_state=object)
    elif how == "global hook":
        fast = fast._replace(hooks=({}, {}, {0: print}, {}))
    elif how == "other shape":
        x = x[:2]
    y = _C.kept_eager(d, x, fast)
    assert y is None or torch.equal(y, reference(m, x))
    return y is None


@pytest.mark.parametrize("how", ["stale route", "own training forward", "compiled call", "backward hook",
                                 "traced by torch.jit", "global hook", "other shape"])
def test_kept_eager_in_c_declines_what_module_call_or_the_route_must_judge(how):
    if _C_exchange() is None:
        pytest.skip("this torch has no DLPack C exchange API")
    m, x = _kept_module(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8))
    with torch.no_grad():
        assert not _declined(None, m, x)
        assert _declined(how, m, x)


def test_kept_eager_in_c_declines_an_active_dropout_between_the_gemms():
    if _C_exchange() is None:
        pytest.skip("this torch has no DLPack C exchange API")
    from fuser import _C
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Dropout(0.5), nn.Linear(24, 8)).eval())
    assert m.spec.mid_dropout is not None
    x = torch.randn(4, 8)
    with torch.no_grad():
        m(x)
    kept = kept_eager(m)
    with torch.no_grad():
        assert torch.equal(_C.kept_eager(m.__dict__, x, kept.fast), reference(m, x))   # eval: no dropout
        m.train()
        assert _C.kept_eager(m.__dict__, x, kept.fast) is None
        torch.manual_seed(3)
        y = m(x)                                        # the module's own path applies the dropout
    assert not torch.equal(y, reference(m, x))


def test_kept_route_leaves_out_an_inactive_dropout_after_the_ffn_and_calls_any_other(monkeypatch, exchange):
    """In eval mode a plain dropout after the FFN is the identity: a kept route (checked in C or here) leaves
    its call out. Its call stays where it would do something or could be observed: a hook on it, a dropout
    subclass, training."""
    calls = []
    real = nn.Dropout.forward
    monkeypatch.setattr(nn.Dropout, "forward", lambda self, x: calls.append(type(self)) or real(self, x))

    class MyDropout(nn.Dropout):
        pass
    for cls in (nn.Dropout, MyDropout):
        torch.manual_seed(0)
        m = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8), cls(0.5)).eval())
        assert m.spec.post_dropout == "3"
        x = torch.randn(4, 8)
        with torch.no_grad():
            m(x)
            assert (kept_eager(m).fast is not None) == exchange
            calls.clear()
            assert torch.equal(m(x), reference(m, x))
            assert calls == ([] if cls is nn.Dropout else [MyDropout])
            seen = []
            handle = m.get_submodule("3").register_forward_hook(lambda mod, args, out: seen.append(1) or out * 2)
            try:
                assert torch.equal(m(x), reference(m, x) * 2) and seen == [1]
            finally:
                handle.remove()
            m.train()
            calls.clear()
            y = m(x)
            assert calls and (y == 0).any()


def test_after_ffn_returns_y_itself_where_the_dropout_is_the_identity(monkeypatch):
    from fuser import _C
    from fuser.structure import DROPOUTS
    calls = []
    real = nn.Dropout.forward
    monkeypatch.setattr(nn.Dropout, "forward", lambda self, x: calls.append(1) or real(self, x))
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8), nn.Dropout(0.5)).eval())
    d, y = m.__dict__, torch.randn(3, 8)
    assert _C.after_ffn(d, "3", DROPOUTS, y) is y and calls == []
    assert torch.equal(_C.after_ffn(d, "3", (), y), y) and calls == [1]    # not a listed class: called
    m.train()
    torch.manual_seed(0)
    assert (_C.after_ffn(d, "3", DROPOUTS, torch.ones(64, 8)) == 0).any()
    with pytest.raises(KeyError):
        _C.after_ffn(d, "nope", DROPOUTS, y)
    with pytest.raises(TypeError, match="after_ffn"):
        _C.after_ffn(None, "3", DROPOUTS, y)


def _C_exchange():
    from fuser import _C
    return _C.tensor_intake()["version"]


# ---- FusedFFN.__call__: the kept route without nn.Module.__call__, and everything that must still see it -----

def _kept_module(*layers):
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(*layers)).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        m(x)
    kept_eager(m)
    return m, x


def test_kept_route_serves_the_call_without_module_call(monkeypatch):
    """With a kept route and nothing that needs nn.Module.__call__, a call goes straight to the route; a
    call the route declines (another shape) goes through nn.Module.__call__ as looked up at that moment
    (so patches of it, as torch.fx's tracer makes, apply)."""
    m, x = _kept_module(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8))
    entered = []
    real = nn.Module.__call__
    monkeypatch.setattr(nn.Module, "__call__", lambda self, *a, **k: entered.append(type(self)) or real(self, *a, **k))
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference(m, x))
        assert FusedFFN not in entered
        x2 = torch.randn(2, 3, 8)
        torch.testing.assert_close(m(x2), reference(m, x2))
        assert entered.count(FusedFFN) == 1
        torch.testing.assert_close(m(x=x), reference(m, x))            # a keyword argument: the module's path
        assert entered.count(FusedFFN) == 2


@pytest.mark.parametrize("how", ["forward_hook", "forward_pre_hook", "global_forward_hook", "forward_on_instance"])
def test_kept_route_leaves_hooks_and_patched_forwards_to_module_call(how):
    m, x = _kept_module(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))
    seen = []
    if how == "forward_hook":
        handle = m.register_forward_hook(lambda mod, args, out: seen.append(1) or out * 2)
    elif how == "forward_pre_hook":
        handle = m.register_forward_pre_hook(lambda mod, args: seen.append(1) or (args[0] * 2,))
    elif how == "global_forward_hook":
        handle = nn.modules.module.register_module_forward_hook(
            lambda mod, args, out: (seen.append(1) or out * 2) if mod is m else None)
    else:   # as accelerate's hooks do: a wrapper of forward set on the instance
        plain = m.forward
        m.forward = lambda x: seen.append(1) or plain(x * 2)
        handle = None
    try:
        with torch.no_grad():
            y = m(x)
        assert seen == [1]
        expected = reference(m, x) * 2 if how in ("forward_hook", "global_forward_hook") else reference(m, x * 2)
        torch.testing.assert_close(y, expected)
    finally:
        if handle is not None:
            handle.remove()


def test_kept_route_applies_the_dropout_after_the_ffn_and_sees_training_mode():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8), nn.Dropout(0.5))
    m = FusedFFN.from_module(seq)
    assert m.spec.post_dropout == "3"
    x = torch.randn(6, 8)
    with torch.no_grad():
        m(x)
        kept_eager(m)
        torch.manual_seed(1)
        y = m(x)                                                       # training: the kept route, then dropout
        torch.manual_seed(1)
        torch.testing.assert_close(y, seq(x))
        assert (y == 0).any()
        m.eval()
        torch.testing.assert_close(m(x), reference(m, x))              # eval: no dropout


def test_kept_launch_runs_only_what_its_preparation_validated(monkeypatch, exchange):
    """The kept fused launch (a Hopper GPU runs it for real: tests/test_gpu_torch.py), here with the
    launch, the device and the stream stood in for: it launches with x's and a new y's addresses while
    everything the preparation validated holds, and declines (None: the general route runs) on each
    change of x, the call's state, the stream or its scratch, and the weights."""
    import fuser.module as fm
    from fuser.module import _KeptLaunch
    runs, prepared = [], []
    scratch = {(-1, 0x1234): "SCRATCH"}

    class FakeLaunch:
        def scratch(self, m, stream):
            return scratch[(-1, stream)]

        def prepare(self, x, caps, activation, y, scratch, stream, borrow):
            prepared.append((x.shape, activation, scratch, stream, borrow))
            return "PREPARED"

    class FakeRoute:
        fused, stale, device, launch, graphs_eager = True, False, -1, FakeLaunch(), False

    monkeypatch.setattr(fm, "_current_device", lambda: -1)
    monkeypatch.setattr(fm, "_raw_stream", lambda device: stream[0])
    monkeypatch.setattr(fm, "_scratch_of", scratch.get)
    # what C reads of each argument: an int or None as it is, a tensor's data_ptr()
    monkeypatch.setattr(fm, "_ffn_run", lambda *a: runs.append(
        tuple(v if v is None or isinstance(v, (int, str)) else v.data_ptr() for v in a)))
    stream = [0x1234]
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 24))
    m = FusedFFN.from_module(mlp).eval()
    x = torch.randn(2, 5, 16)
    w = m.weights()
    k = _KeptLaunch.bind(m, FakeRoute(), x, w, torch.empty(2, 5, 24))
    assert prepared == [((2, 5, 16), "gelu", "SCRATCH", 0x1234, 0b1010110)]   # w_up, w_down, b_up, b_down kept
    assert (k.signature is not None) == exchange                              # checked in C, or here

    def launches(xin):
        before = len(runs)
        y = k.run(m, xin)
        if y is None:
            assert len(runs) == before
            return False
        assert y.shape == (2, 5, 24) and y.dtype == xin.dtype and runs[-1] == ("PREPARED", xin.data_ptr(), y.data_ptr())
        return True

    with torch.no_grad():
        assert launches(x)
        k.graphs_eager = True                       # a host-bound route's launch: none while a graph is captured
        monkeypatch.setattr(fm, "_capturing", lambda: True)
        assert not launches(x)
        monkeypatch.setattr(fm, "_capturing", lambda: False)
        assert launches(x)
        monkeypatch.setattr(fm, "_thread_prepared", lambda device: False)   # not until this thread's handles
        assert not launches(x)
        monkeypatch.setattr(fm, "_thread_prepared", lambda device: device == -1)
        assert launches(x)
        k.graphs_eager = False
        assert not launches(torch.randn(3, 5, 16))                                # another shape
        assert not launches(x.double())                                           # another dtype
        assert not launches(torch.randn(2, 16, 5).transpose(1, 2))                # not contiguous
        assert not launches(torch.randn(161)[1:].view(2, 5, 16))                  # not 16-byte aligned
        assert not launches(nn.Parameter(x))                                      # not a plain tensor
        stream[0] = 0x5678
        assert not launches(x)                                                    # another stream
        stream[0] = 0x1234
        scratch[(-1, 0x1234)] = "BIGGER"
        assert not launches(x)                                                    # the stream's scratch replaced
        scratch[(-1, 0x1234)] = "SCRATCH"
        assert launches(x)
        monkeypatch.setenv("FUSER_DISABLE", "1")
        assert not launches(x)
        monkeypatch.delenv("FUSER_DISABLE")
        with torch.autocast("cpu"):
            assert not launches(x)
        m.train()
        assert launches(x)            # no dropout and no forward of its own in training: the kept launch
        m.eval()
    assert not launches(x)                                                        # autograd to record
    with torch.no_grad():
        assert launches(x)
        mlp[0].weight.mul_(2)                                                     # in place: same memory
        assert launches(x)
        up = mlp[0].weight
        up.data = torch.as_strided(up.data, up.shape, (1, 48))                    # same memory and shape, strided
        assert not launches(x)
        up.data = up.data.contiguous()
        assert not launches(x)                                                    # another address
    k = _KeptLaunch.bind(m, FakeRoute(), x, m.weights(), torch.empty(2, 5, 24))
    with torch.no_grad():
        assert launches(x)
        mlp[2].bias = nn.Parameter(torch.randn(24))                               # a new Parameter
        assert not launches(x)
        k = _KeptLaunch.bind(m, FakeRoute(), x, m.weights(), torch.empty(2, 5, 24))
        assert launches(x)
        setattr(m, "2", nn.Linear(48, 24))                                        # a new owner
        assert not launches(x)
        k = _KeptLaunch.bind(m, FakeRoute(), x, m.weights(), torch.empty(2, 5, 24))
        assert launches(x)
        FakeRoute.stale = True                                                    # plans forgotten
        assert not launches(x)


# ---- fuser.ffn's kept routes in one C call (_C.ffn_kept) ------------------------------------------------

def test_ffn_kept_runs_the_route_kept_under_the_calls_key(exchange):
    """`_C.ffn_kept` (with torch tensors read through the exchange API or exported): None where nothing is kept for
    the call's route key, or the route is stale, or the arguments are ones ffn_key refuses (the general path then
    says what is wrong); an eager route's ops run in the call, bitwise the reference's; any other route's run()
    gets the call's arguments and gives its output; with an `out` (checked with the rest) every route's run() gets
    it."""
    from fuser import _C
    from fuser.reference import ACTIVATIONS, eager
    lin = torch.nn.functional.linear
    torch.manual_seed(0)
    x, wu, wd, wg = torch.randn(5, 16), torch.randn(48, 16), torch.randn(16, 48), torch.randn(48, 16)
    args = (x, wu, wd, wg, None, None, None, "silu")
    key = _C.ffn_key(*args)

    class Kept:
        def __init__(self, fused, stale=False):
            self.fused, self.stale, self.calls = fused, stale, []

        def run(self, *a):
            self.calls.append(a)
            return "ran"

    assert _C.ffn_kept({}, lin, *args) is None
    assert _C.ffn_kept({key: Kept(False, stale=True)}, lin, *args) is None
    y = _C.ffn_kept({key: Kept(False)}, lin, *args)
    assert torch.equal(y, eager(x, wu, wd, wg, None, None, None, ACTIVATIONS["silu"]))
    fused = Kept(True)
    assert _C.ffn_kept({key: fused}, lin, *args) == "ran" and fused.calls == [args]
    out = torch.empty(5, 16)
    assert _C.ffn_kept({key: fused}, lin, *args, out) == "ran" and fused.calls[-1] == (*args, out)
    eager_route = Kept(False)                                  # with out, every route's run gets the call
    assert _C.ffn_kept({key: eager_route}, lin, *args, out) == "ran" and eager_route.calls == [(*args, out)]
    assert _C.ffn_kept({key: fused}, lin, *args, None) == "ran" and fused.calls[-1] == args
    assert _C.ffn_kept({key: fused}, lin, *args, torch.empty(5, 15)) is None                     # out's shape
    assert _C.ffn_kept({key: fused}, lin, *args, torch.empty(5, 16, requires_grad=True)) is None  # out records
    assert _C.ffn_kept({key: fused}, lin, x, wu, wd, wg, None, None, None, "tanh") is None        # refused by ffn_key
    assert _C.ffn_kept({key: fused}, lin, x[:, :8], wu, wd, wg, None, None, None, "silu") is None  # another shape

    class Broken(Kept):
        def run(self, *a):
            raise RuntimeError("from run")
    with pytest.raises(RuntimeError, match="from run"):
        _C.ffn_kept({key: Broken(True)}, lin, *args)
    with pytest.raises(TypeError, match="ffn_kept"):
        _C.ffn_kept([], lin, *args)


def test_fuser_ffn_serves_a_kept_eager_route_without_a_python_frame_of_fusers(exchange):
    """After a shape's first call, fuser.ffn's eager route runs in one C call: no Python function of fuser's
    package runs besides ffn itself (not Route.run, not the key's or the route's lookup); the operator's
    autograd kernel finds it the same way."""
    import fuser.ops as fops
    here = os.path.dirname(fops.__file__)
    torch.manual_seed(1)
    x, wu, wd = torch.randn(4, 8), torch.randn(24, 8), torch.randn(8, 24)
    with torch.no_grad():
        want = fuser.ffn(x, wu, wd, activation="relu")    # decides and keeps the route
        frames = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(here):
                frames.append(frame.f_code.co_name)
        sys.setprofile(profile)
        try:
            y = fuser.ffn(x, wu, wd, activation="relu")
            z = fops.run_kept(x, wu, wd, None, None, None, None, "relu")
        finally:
            sys.setprofile(None)
    assert torch.equal(y, want) and torch.equal(z, want)
    assert frames == ["ffn", "run_kept"], frames

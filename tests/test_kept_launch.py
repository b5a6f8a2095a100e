"""FusedFFN's kept launch run from C (python/kept_bind.c's kept_launch): after a fused route's first call, a call
of the module runs the kept launch's checks and the launch itself in one C call, from the module's call slot or
FusedFFN.__call__. On any machine: the launch is a recorder here and the CUDA predicates (current device, raw
stream, capture) are fakes registered with ``_C.gate_setup``, so every check C makes is exercised on CPU tensors:
each condition under which fuser.module's ``_KeptLaunch.run`` declines makes C decline too, and where none applies
C hands the recorder x's address and a new y. (The real launch on a Hopper GPU: tests/test_gpu_torch.py.)"""
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fuser import _C, route, runtime
from fuser.module import DROPOUTS, FusedFFN, _GLOBAL_HOOKS, _KeptLaunchFast, _Weights, _tracing_state
from fuser.reference import ACTIVATIONS

DEVICE, STREAM = 0, 7


@pytest.fixture
def cuda_state():
    """The CUDA predicates C reads, faked: {"device": current device, "stream": its raw stream, "capturing": bool}."""
    if _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API (kept launches are then checked in Python)")
    state = {"device": DEVICE, "stream": STREAM, "capturing": False}
    _C.gate_setup(runtime.gate_cubin, tuple(ACTIVATIONS[a] for a in runtime.GATE_ACTS), lambda: state["capturing"],
                  torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled,
                  lambda: state["device"], lambda device: state["stream"] if device == DEVICE else -1,
                  runtime.interop.disabled, torch.is_grad_enabled, None, (None,) * 4, None)
    yield state
    runtime.register_eager_hooks()


class _Kept:
    """What FusedFFN keeps under "_kept": here only what its call reads."""

    run_c = _C.kept_launch

    def __init__(self, fast):
        self.fast = fast

    def run(self, module, x):
        return None                              # (forward's kept route: declines, the general route runs)


def kept_launch(m, x, **change):
    """A kept launch's fields for module m and inputs like x, whose launch records its arguments in `.ran`."""
    ran = []
    m.weights()                                  # (what FusedFFN reads before it keeps a route)
    w = _Weights.of(m)
    fields = dict(route=route.Route(), mid=m.spec.mid_dropout, post=m.spec.post_dropout, dropouts=DROPOUTS,
                  train_source=bool(m.spec.train_source), hooks=_GLOBAL_HOOKS, tracing_state=_tracing_state,
                  prepared=torch.utils.dlpack.to_dlpack(torch.zeros(1)), run=lambda p, ptr, y: ran.append((ptr, y)),
                  signature=_C.tensor_signature(x), held=w.held, layout=w.layout, device=DEVICE, stream=STREAM,
                  scratches={(DEVICE, STREAM): "scratch"}, skey=(DEVICE, STREAM), scratch="scratch",
                  grad_of=w.params, graphs_eager=False, out_shape=None,
                  autocast=torch._C._is_any_autocast_enabled, empty_like=torch.empty_like)
    fields.update(change)
    return _KeptLaunchFast(**fields), ran


def module(post_dropout=False):
    """A FusedFFN of a GELU MLP (and the Sequential it was made from, which holds its Linears)."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)] + ([nn.Dropout(0.1)] if post_dropout else [])
    mlp = nn.Sequential(*layers).bfloat16()
    return FusedFFN.from_module(mlp).eval(), mlp


def aligned(m=4, d=16, skew=0):
    """An [m, d] bfloat16 tensor at a 16-byte aligned address, or `skew` elements past one."""
    x = torch.randn(m * d + 64).bfloat16()
    off = (-x.data_ptr() % 16) // 2 + skew
    return x[off:off + m * d].view(m, d)


def test_the_kept_launch_runs_from_c_with_xs_address_and_a_new_y(cuda_state):
    (m, _), x = module(), aligned()
    fast, ran = kept_launch(m, x)
    with torch.no_grad():
        y = _C.kept_launch(m.__dict__, x, fast)
    assert len(ran) == 1 and ran[0][0] == x.data_ptr() and ran[0][1] is y
    assert y.shape == x.shape and y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
    # y of another shape where d_out is not d_model: x.new_empty(out_shape)
    fast, ran = kept_launch(m, x, out_shape=(4, 24))
    with torch.no_grad():
        y = _C.kept_launch(m.__dict__, x, fast)
    assert y.shape == (4, 24) and ran[0][1] is y


def test_the_call_slot_and_fusedffns_call_run_it(cuda_state):
    (m, _), x = module(), aligned()
    fast, ran = kept_launch(m, x)
    m.__dict__["_kept"] = _Kept(fast)
    with torch.no_grad():
        y = m(x)                                  # the C call slot
        y2 = FusedFFN.__call__(m, x)              # the class's __call__, as written in Python
    assert len(ran) == 2 and ran[0][1] is y and ran[1][1] is y2
    # a kept launch that declines sends the call on to nn.Module.__call__ (the general route: here the ops)
    m.__dict__["_kept"] = _Kept(kept_launch(m, x, device=DEVICE + 1)[0])
    with torch.no_grad():
        y = m(x)
    w = m.weights()
    torch.testing.assert_close(y, ACTIVATIONS["gelu"](x @ w["up"].t() + w["b_up"]) @ w["down"].t() + w["b_down"],
                               rtol=2e-2, atol=2e-2)


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


DECLINES = ["FUSER_DISABLE", "autocast", "grad through the weights", "grad through x", "a dispatch mode",
            "another device", "another stream", "the scratch replaced", "a capture on a host-bound route",
            "a stale route", "misaligned x", "non-contiguous x", "another shape", "a new Parameter",
            "a forward hook", "a global hook", "training its own forward"]


@pytest.mark.parametrize("why", DECLINES)
def test_the_kept_launch_declines_where_the_python_checks_would(why, cuda_state, monkeypatch):
    (m, mlp), x = module(), aligned()
    change = {}
    if why == "a capture on a host-bound route":
        change["graphs_eager"] = True
        cuda_state["capturing"] = True
    if why == "a stale route":
        r = route.Route()
        r.stale = True
        change["route"] = r
    if why == "training its own forward":
        change["train_source"] = True
        m.train()
    fast, ran = kept_launch(m, x, **change)
    grad = why.startswith("grad")
    if why == "FUSER_DISABLE":
        monkeypatch.setenv("FUSER_DISABLE", "1")
    if why == "grad through x":
        x = x.clone().requires_grad_()
        fast, ran = kept_launch(m, x, grad_of=())
    if why == "another device":
        cuda_state["device"] = DEVICE + 1
    if why == "another stream":
        cuda_state["stream"] = STREAM + 1
    if why == "the scratch replaced":
        fast.scratches[(DEVICE, STREAM)] = "another scratch"
    if why == "misaligned x":
        x = aligned(skew=1)                                      # the same signature, 2 bytes off
    if why == "non-contiguous x":
        x = torch.empty(4, 32, dtype=torch.bfloat16)[:, ::2]     # the same signature, other strides
    if why == "another shape":
        x = aligned(5)
    if why == "a new Parameter":
        mlp[0].weight = nn.Parameter(torch.randn(48, 16).bfloat16())
    if why == "a forward hook":
        m.register_forward_hook(lambda *a: None)
    handle = nn.modules.module.register_module_forward_hook(lambda *a: None) if why == "a global hook" else None
    try:
        with torch.set_grad_enabled(grad), \
                (torch.autocast("cpu", dtype=torch.bfloat16) if why == "autocast" else _nullcontext()), \
                (_Mode() if why == "a dispatch mode" else _nullcontext()):
            y = _C.kept_launch(m.__dict__, x, fast)
    finally:
        if handle is not None:
            handle.remove()
    assert y is None and not ran, why


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_dropout_after_the_ffn_is_left_out_in_eval_and_called_in_training(cuda_state):
    (m, _), x = module(post_dropout=True), aligned()
    assert m.spec.post_dropout is not None
    fast, ran = kept_launch(m, x)
    with torch.no_grad():
        y = _C.kept_launch(m.__dict__, x, fast)
        assert ran[0][1] is y                     # eval: the identity, not called
        m._modules[m.spec.post_dropout].train()
        y = _C.kept_launch(m.__dict__, x, fast)
    assert ran[1][1] is not y and y.shape == x.shape   # training: the dropout's own output


def test_kept_launch_says_what_it_takes():
    with pytest.raises(TypeError, match=r"kept_launch\(d: dict, x, k: tuple of"):
        _C.kept_launch({}, torch.zeros(1), (1, 2))
    with pytest.raises(TypeError, match="kept_launch"):
        _C.kept_launch([], torch.zeros(1), tuple(range(len(_KeptLaunchFast._fields))))

"""FusedFFN's kept launch run from C (python/kept_bind.c's kept_launch): after a fused route's first call, a call
of the module runs the kept launch's checks and the launch itself in one C call, from the module's call slot or
FusedFFN.__call__. On any machine: the launch is a recorder here and the CUDA predicates (current device, raw
stream, capture) are fakes registered with ``_C.gate_setup``, so every check C makes is exercised on CPU tensors:
each condition under which fuser.module's ``_KeptLaunch.run`` declines makes C decline too, and where none applies
C hands the recorder x's address and a new y. Likewise a kept fused route's prepared launch, which ``fuser.ffn`` and
the operator run in their one C call (python/ffn_bind.c's fused_run) wherever fuser.route's ``FusedRoute.run`` would
launch it, and hand to that ``run`` everywhere else. (The real launches on a Hopper GPU: tests/test_gpu_torch.py.)"""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fuser import _C, route, runtime
from fuser.module import DROPOUTS, FusedFFN, _GLOBAL_HOOKS, _KeptLaunchFast, _Weights, _tracing_state
from fuser.reference import ACTIVATIONS

DEVICE, STREAM = 0, 7      # (conftest's fake_cuda: the current device and its raw stream)


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


def test_the_kept_launch_runs_from_c_with_xs_address_and_a_new_y(fake_cuda):
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


def test_the_call_slot_and_fusedffns_call_run_it(fake_cuda):
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
def test_the_kept_launch_declines_where_the_python_checks_would(why, fake_cuda, monkeypatch):
    (m, mlp), x = module(), aligned()
    change = {}
    if why == "a capture on a host-bound route":
        change["graphs_eager"] = True
        fake_cuda["capturing"] = True
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
        fake_cuda["device"] = DEVICE + 1
    if why == "another stream":
        fake_cuda["stream"] = STREAM + 1
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


def test_the_dropout_after_the_ffn_is_left_out_in_eval_and_called_in_training(fake_cuda):
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


# ---- a fused route's prepared launch, run by fuser.ffn's and the operator's kept call ----------------------

class _FusedRoute:
    """What C reads of a kept fused route (fuser.route's FusedRoute): stale, fused, `fast`; its Python `run`
    records the calls C hands over."""

    stale, fused = False, True

    def __init__(self, fast):
        self.fast, self.runs = fast, []

    def run(self, x, *args):
        self.runs.append(args)
        return "run in Python"


def kept_fused_route(x, wu, wd, **change):
    """A fake fused route kept in fuser.ops._routes under the key of fuser.ffn(x, wu, wd, activation="relu"), with a
    launch prepared for the fake current stream; returns it and the recorded launches."""
    from fuser import ops
    launched = []
    f = dict(device=DEVICE, prepared={(STREAM, x.numel() // x.shape[-1], wu.data_ptr(), wd.data_ptr(), None):
                                      ("scratch", "prepared launch")},
             scratches={(DEVICE, STREAM): "scratch"}, same_shape=True, graphs_eager=False,
             run=lambda *a: launched.append(a), empty_like=torch.empty_like)
    f.update(change)
    r = _FusedRoute(tuple(f.values()))
    ops._routes[_C.ffn_key(x, wu, wd, None, None, None, None, "relu")] = r
    return r, launched


@pytest.fixture
def ffn_tensors():
    from fuser import ops
    torch.manual_seed(1)
    x, wu, wd = aligned(), torch.randn(48, 16).bfloat16(), torch.randn(16, 48).bfloat16()
    yield x, wu, wd
    ops._routes.clear()


@pytest.mark.parametrize("entry", ["fuser.ffn", "torch.ops.fuser.ffn"])
def test_a_kept_fused_routes_prepared_launch_runs_in_the_kept_call(entry, fake_cuda, ffn_tensors):
    import fuser
    x, wu, wd = ffn_tensors
    r, launched = kept_fused_route(x, wu, wd)
    with torch.no_grad():
        y = (fuser.ffn(x, wu, wd, activation="relu") if entry == "fuser.ffn" else
             torch.ops.fuser.ffn(x, wu, wd, None, None, None, None, "relu"))
    assert not r.runs and len(launched) == 1
    prepared, xa, ya, up, down, gate, *biases = launched[0]
    assert prepared == "prepared launch" and xa is x and ya is y and y.shape == x.shape
    assert (up, down, gate, biases) == (wu.data_ptr(), wd.data_ptr(), None, [None, None, None])


def test_a_host_bound_routes_launches_run_in_c_only_on_a_thread_that_made_its_cublas_handles(fake_cuda, ffn_tensors):
    """A host-bound route's graphs run the eager ops, whose cuBLAS handles PyTorch makes per thread at the thread's
    first GEMM, which a capture refuses to: the C paths (FusedFFN's kept launch, fuser.ffn's kept route) launch
    such a route's calls only on a thread marked as having made them (`_C.thread_prepared`), and leave a fresh
    thread's calls to Python, whose HostBoundRoute.run makes them first. Each check runs on a thread of its own."""
    import fuser
    (m, _), x = module(), aligned()
    fast, ran = kept_launch(m, x, graphs_eager=True)
    xf, wu, wd = ffn_tensors
    r, launched = kept_fused_route(xf, wu, wd, graphs_eager=True)

    def calls(mark):
        assert not _C.thread_prepared(DEVICE)
        if mark:
            assert _C.thread_prepared(DEVICE, True) and _C.thread_prepared(DEVICE)
        with torch.no_grad():
            return _C.kept_launch(m.__dict__, x, fast), fuser.ffn(xf, wu, wd, activation="relu")

    def on_a_new_thread(mark):
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(calls, mark).result()
    assert on_a_new_thread(False) == (None, "run in Python") and not ran and not launched and len(r.runs) == 1
    y, y2 = on_a_new_thread(True)
    assert ran[0][1] is y and launched[0][2] is y2 and len(r.runs) == 1
    assert on_a_new_thread(False) == (None, "run in Python") and len(ran) == len(launched) == 1   # per thread
    with pytest.raises(TypeError, match=r"thread_prepared\(device: int"):
        _C.thread_prepared("cuda:0")
    assert _C.thread_prepared(64) and _C.thread_prepared(-1)                                    # not tracked


FUSED_DECLINES = ["FUSER_DISABLE", "grad through x", "grad through a weight", "another device", "another stream",
                  "the scratch replaced", "a capture on a host-bound route", "y of another shape", "out=",
                  "other weights"]


@pytest.mark.parametrize("why", FUSED_DECLINES)
def test_a_kept_fused_route_runs_in_python_where_its_run_must_decide(why, fake_cuda, ffn_tensors, monkeypatch):
    import fuser
    x, wu, wd = ffn_tensors
    change = {"y of another shape": {"same_shape": False}, "a capture on a host-bound route": {"graphs_eager": True}}
    r, launched = kept_fused_route(x, wu, wd, **change.get(why, {}))
    fake_cuda["capturing"] = why == "a capture on a host-bound route"
    if why == "FUSER_DISABLE":
        monkeypatch.setenv("FUSER_DISABLE", "1")
    if why == "another device":
        fake_cuda["device"] = DEVICE + 1
    if why == "another stream":
        fake_cuda["stream"] = STREAM + 1
    if why == "the scratch replaced":
        r.fast[2][(DEVICE, STREAM)] = "another scratch"
    if why == "other weights":                  # the same route key, no launch prepared for their addresses
        wu, wd = wu.clone(), wd.clone()
    grad = why.startswith("grad")
    if why == "grad through x":
        x.requires_grad_()
    if why == "grad through a weight":
        wd.requires_grad_()
    out = torch.empty_like(x) if why == "out=" else None
    with torch.set_grad_enabled(grad):
        y = fuser.ffn(x, wu, wd, activation="relu", out=out)
    assert not launched and len(r.runs) == 1 and (y == "run in Python" or y is out), why

"""torch tensors handed to C without capsules: the DLPack C exchange API (``__dlpack_c_exchange_api__``)
behind ``_C.ffn_key``, the kept routes' checks (``_C.kept_match``) and the operator's shortcut.

The C side is also driven here by an exchange table of the tests' own, written with ctypes from the
DLPack 1.3 header (not from fuser's declarations), so that each of its branches runs: a table that
describes in place, one that only exports owning tensors, one that fails, and tables of another major
version."""
import ctypes

import pytest
import torch
from torch import nn

import fuser
from dlpack_producer import (DELETER, KDLCPU, KDLFLOAT, DLDataType, DLDevice, DLManagedTensorVersioned,
                             DLPackVersion, DLTensor)
from fuser import _C, interop

HAS_EXCHANGE = _C.tensor_intake()["version"] is not None
needs_exchange = pytest.mark.skipif(not HAS_EXCHANGE, reason="this torch has no DLPack C exchange API")
ORDER = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")


@pytest.fixture(autouse=True)
def registered():
    """torch.Tensor registered as fuser.interop registers it, before and after every test."""
    interop.register()
    fuser.route.forget()
    yield
    interop.register()
    fuser.route.forget()


def tensors(m=4, k=16, n=48, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(m, k, generator=g).to(dtype), w_up=torch.randn(n, k, generator=g).to(dtype),
                w_down=torch.randn(k, n, generator=g).to(dtype), w_gate=None, b_up=None, b_gate=None, b_down=None)


def moved(before):
    after = _C.tensor_intake()
    return after["exchanged"] - before["exchanged"], after["exported"] - before["exported"]


# ---- torch's own table -----------------------------------------------------------------------------

@needs_exchange
def test_torch_registers_its_table_of_major_version_1():
    info = _C.tensor_intake()
    assert info["type"] is torch.Tensor and info["exporter"] is interop.to_capsule
    assert info["exchange"] == (torch.Tensor, nn.Parameter) and info["version"][0] == 1 and info["describe"]


@needs_exchange
def test_ffn_takes_plain_tensors_and_parameters_through_the_exchange_api():
    """fuser.ffn's every call reads each tensor through the exchange API: no capsule is exported, for
    plain tensors and Parameters alike; a tensor subclass gets a capsule of torch's exporter instead."""
    a = tensors()
    w_up, w_down = nn.Parameter(a["w_up"]), nn.Parameter(a["w_down"])
    with torch.no_grad():
        fuser.ffn(a["x"], w_up, w_down, activation="relu")      # the first call of the key: routed
        before = _C.tensor_intake()
        for _ in range(3):
            y = fuser.ffn(a["x"], w_up, w_down, activation="relu")
        assert moved(before) == (9, 0)
        torch.testing.assert_close(y, fuser.ffn_reference(a["x"], w_up, w_down, activation="relu"))

        class Sub(torch.Tensor):
            pass

        before = _C.tensor_intake()
        y = fuser.ffn(a["x"].as_subclass(Sub), w_up, w_down, activation="relu")
        assert moved(before) == (2, 1)
        torch.testing.assert_close(y.as_subclass(torch.Tensor),
                                   fuser.ffn_reference(a["x"], w_up, w_down, activation="relu"))


@needs_exchange
@pytest.mark.parametrize("odd", ["subclass", "meta", "sparse", "requires_grad", "inference"])
def test_ffn_key_is_the_same_either_way(odd):
    """What ffn_key answers for a tensor the exchange API reads, or cannot, is what it answers when it
    exports capsules of torch's exporter instead: the same key, or the same exception and message."""
    a = tensors()

    class Sub(torch.Tensor):
        pass

    if odd == "subclass":
        a["x"] = a["x"].as_subclass(Sub)
    elif odd == "meta":
        a["w_up"] = a["w_up"].to("meta")
    elif odd == "sparse":
        a["w_down"] = a["w_down"].to_sparse()
    elif odd == "requires_grad":
        a["w_up"].requires_grad_()
    else:
        with torch.inference_mode():
            a["x"] = a["x"].clone()
    answers = []
    for exchange in (True, False):
        interop.register(exchange=exchange)
        try:
            answers.append(("key", _C.ffn_key(*(a[n] for n in ORDER), "relu")))
        except Exception as e:  # noqa: BLE001 (compared below)
            answers.append((type(e), str(e)))
    assert answers[0] == answers[1]
    if odd in ("meta", "sparse"):
        assert answers[0][0] is TypeError and "cannot be taken through DLPack" in answers[0][1]
    else:
        assert answers[0][0] == "key"


def test_ffn_key_without_a_registered_type_takes_nothing():
    a = tensors()
    _C.register_tensor_type(None)
    assert _C.tensor_intake()["type"] is None
    with pytest.raises(TypeError, match="x: expected a tensor of a registered type, got Tensor"):
        _C.ffn_key(*(a[n] for n in ORDER), "relu")


def test_registration_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="type: expected a type or None"):
        _C.register_tensor_type(3)
    with pytest.raises(TypeError, match="exporter: expected a callable"):
        _C.register_tensor_type(torch.Tensor, 3)
    with pytest.raises(TypeError, match="exchange: expected subclasses of Tensor"):
        _C.register_tensor_type(torch.Tensor, None, (int,))
    with pytest.raises(ValueError, match="at most 4 types"):
        _C.register_tensor_type(torch.Tensor, None, (torch.Tensor,) * 5)

    class NoAPI:
        pass

    assert _C.register_tensor_type(NoAPI, None, (NoAPI,)) is None     # no table: nothing exchanged
    assert _C.tensor_intake()["exchange"] == ()

    class BadAPI:
        __dlpack_c_exchange_api__ = 7

    with pytest.raises(TypeError, match="is not a capsule named 'dlpack_exchange_api'"):
        _C.register_tensor_type(BadAPI, None, (BadAPI,))


# ---- the kept routes' check ------------------------------------------------------------------------

@needs_exchange
def test_layout_and_signature_say_what_changed():
    w = nn.Parameter(torch.randn(8, 8))
    x = torch.randn(3, 8)
    layout, signature = _C.tensor_layout(w, None), _C.tensor_signature(x)
    assert _C.tensor_layout(w, None) == layout and _C.tensor_layout(w) != layout
    with torch.no_grad():
        w.mul_(2)                                                    # in place: the same layout
    assert _C.tensor_layout(w, None) == layout
    w.data = w.data.t()                                              # same address and shape, other strides
    assert _C.tensor_layout(w, None) != layout
    assert _C.tensor_signature(torch.randn(3, 8)) == signature       # another address: the same signature
    for other in (torch.randn(4, 8), torch.randn(3, 8).double(), nn.Parameter(torch.randn(3, 8))):
        assert _C.tensor_signature(other) != signature               # shape, dtype, exact type

    class Sub(torch.Tensor):
        pass

    assert _C.tensor_signature(x.as_subclass(Sub)) is None and _C.tensor_layout(x.as_subclass(Sub)) is None
    assert _C.tensor_signature("x") is None


@needs_exchange
def test_kept_match_checks_x_and_every_weight():
    lin = nn.Linear(8, 8)
    registry = {"lin": lin}
    held = tuple((registry, "lin", lin, lin._parameters, name, p) for name, p in lin.named_parameters())
    layout = _C.tensor_layout(*(row[5] for row in held))
    x = torch.randn(3, 8)
    signature = _C.tensor_signature(x)
    assert _C.kept_match(x, signature, held, layout) == x.data_ptr()
    xt = torch.randn(8, 3).t()
    assert _C.kept_match(xt, signature, held, layout) == 0             # not contiguous: no address
    assert _C.kept_match(torch.randn(2, 8), signature, held, layout) is None
    with torch.no_grad():
        lin.weight.add_(1)
    assert _C.kept_match(x, signature, held, layout) == x.data_ptr()
    lin.bias = nn.Parameter(torch.randn(8))                           # a new Parameter
    assert _C.kept_match(x, signature, held, layout) is None
    lin.bias = held[1][5]
    registry["lin"] = nn.Linear(8, 8)                                 # a new owner
    assert _C.kept_match(x, signature, held, layout) is None
    registry["lin"] = lin
    lin.weight.data = torch.randn(8, 8)                               # new memory
    assert _C.kept_match(x, signature, held, layout) is None


@needs_exchange
def test_kept_match_checks_the_layouts_of_the_laid_rows_only():
    """`laid` (a bit per row of `held`): the rows whose Parameter's layout is checked; every row's identity
    is checked whatever the mask."""
    lin = nn.Linear(8, 8)
    registry = {"lin": lin}
    held = tuple((registry, "lin", lin, lin._parameters, name, p) for name, p in lin.named_parameters())
    x = torch.randn(3, 8)
    signature = _C.tensor_signature(x)
    bias_only = _C.tensor_layout(lin.bias)
    assert _C.kept_match(x, signature, held, bias_only, 0b10) == x.data_ptr()
    assert _C.kept_match(x, signature, held, b"", 0) == x.data_ptr()
    assert _C.kept_match(x, signature, held, bias_only) is None        # all rows laid: the weight's missing
    lin.weight.data = torch.randn(8, 8)                                # new memory, in a row not laid
    assert _C.kept_match(x, signature, held, bias_only, 0b10) == x.data_ptr()
    lin.bias.data = torch.randn(8)                                     # ...and in one laid
    assert _C.kept_match(x, signature, held, bias_only, 0b10) is None
    lin.bias = nn.Parameter(torch.randn(8))                           # a new Parameter: no row passes
    assert _C.kept_match(x, signature, held, b"", 0) is None
    with pytest.raises(TypeError, match="laid: int"):
        _C.kept_match(x, signature, held, b"", "all")


def kept_eager_mlp(d, f):
    """A GELU MLP d -> f -> d, its FusedFFN (eval) and an input the FusedFFN has been called with once (so it
    keeps its eager route for that shape)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(d, f), nn.GELU(), nn.Linear(f, d))
    m = fuser.FusedFFN.from_module(mlp).eval()
    x = torch.randn(3, d)
    with torch.no_grad():
        m(x)
    return mlp, m, x


@needs_exchange
def test_kept_eager_route_describes_x_and_the_sliced_weights_only():
    """A kept eager call reads x through the exchange API, and of the weights only those it holds as row
    slices (whose Parameter's memory it must see unchanged); the ops read every other Parameter itself."""
    mlp, m, x = kept_eager_mlp(16, 48)
    with torch.no_grad():
        before = _C.tensor_intake()["exchanged"]
        for _ in range(5):
            m(x)
        assert _C.tensor_intake()["exchanged"] - before == 5


@needs_exchange
def test_kept_eager_route_runs_a_weight_seen_another_way_as_the_module_does():
    """A square weight whose data is replaced by its own transpose keeps its address and shape: the kept
    eager route's ops read the Parameter as it now is, giving the module's own result; a new swap refuses
    the weight, which the fused kernels cannot read (not contiguous), naming it."""
    mlp, m, x = kept_eager_mlp(16, 16)
    with torch.no_grad():
        assert m.__dict__["_kept"].signature is not None
        mlp[0].weight.data = mlp[0].weight.data.t()
        torch.testing.assert_close(m(x), mlp(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="0.weight is not contiguous"):
        fuser.FusedFFN.from_module(mlp)


# ---- the operator's shortcut -----------------------------------------------------------------------

def test_operator_runs_a_kept_route_directly(monkeypatch):
    """torch.ops.fuser.ffn runs the route kept for its key from the autograd kernel: after the first
    call of a key, no general route and no implementation call; an x the route cannot take as it is
    (not contiguous) goes through the implementation, which copies it."""
    import fuser.custom_op
    import fuser.ops
    impl, routed = [], []
    real_impl, real_route = fuser.custom_op._impl, fuser.ops.route
    monkeypatch.setattr(fuser.custom_op, "_impl", lambda *a: impl.append(1) or real_impl(*a))
    monkeypatch.setattr(fuser.ops, "route", lambda *a, **k: routed.append(1) or real_route(*a, **k))
    a = tensors()
    args = [a[n] for n in ORDER]
    want = fuser.ffn_reference(a["x"], a["w_up"], a["w_down"], activation="silu")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(torch.ops.fuser.ffn(*args, "silu"), want)
        assert (len(impl), len(routed)) == (1, 1)
        xt = a["x"].t().contiguous().t()
        torch.testing.assert_close(torch.ops.fuser.ffn(xt, *args[1:], "silu"), want)
        assert (len(impl), len(routed)) == (2, 2)
    y = torch.ops.fuser.ffn(a["x"], nn.Parameter(a["w_up"]), *args[2:], "silu")   # autograd records it:
    assert y.requires_grad and len(routed) == 3                  # below autograd, the implementation routes


# ---- a table of the tests' own ---------------------------------------------------------------------

DESCRIBE = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
EXPORT = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))


class ExchangeAPI(ctypes.Structure):
    """DLPackExchangeAPI: the header (version, prev_api), then five function pointers."""
    _fields_ = [("version", DLPackVersion), ("prev_api", ctypes.c_void_p), ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", EXPORT),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", DESCRIBE), ("current_work_stream", ctypes.c_void_p)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = ctypes.c_char_p(b"dlpack_exchange_api")   # the capsule keeps the pointer: kept alive here


class Table:
    """An exchange table for `Held`, a producer type whose objects hold a float32 torch tensor `t`: it
    describes them in place (`describe`), or only exports owning tensors, counting deletions, or fails.
    `major`: its version; `prev`: an older table it points to."""

    def __init__(self, describe=True, fail=False, major=1, prev=None):
        self.fail, self.calls, self.deleted, self.live = fail, [], 0, {}
        self.api = ExchangeAPI()
        self.api.version = DLPackVersion(major, 3)
        self.api.prev_api = None if prev is None else ctypes.addressof(prev.api)
        self.prev = prev
        self._describe, self._export = DESCRIBE(self.describe), EXPORT(self.export)
        self._deleter = DELETER(self.on_delete)
        self.api.managed_tensor_from_py_object_no_sync = self._export
        if describe:
            self.api.dltensor_from_py_object_no_sync = self._describe
        self.capsule = _new_capsule(ctypes.addressof(self.api), _CAPSULE_NAME, None)

    def fill(self, obj, d):
        t = obj.t
        d.data = t.data_ptr()
        d.device = DLDevice(KDLCPU, 0)
        d.ndim = t.dim()
        d.dtype = DLDataType(KDLFLOAT, 32, 1)
        d.shape = ctypes.cast(obj.shape, ctypes.POINTER(ctypes.c_int64))
        d.strides = None
        d.byte_offset = 0

    def describe(self, obj, out):
        self.calls.append("describe")
        if self.fail:
            return -1
        self.fill(obj, out.contents)
        return 0

    def export(self, obj, out):
        self.calls.append("export")
        if self.fail:
            return -1
        mt = DLManagedTensorVersioned()
        mt.version = DLPackVersion(1, 0)
        mt.deleter = self._deleter
        self.fill(obj, mt.dl_tensor)
        self.live[ctypes.addressof(mt)] = (mt, obj.shape)
        out[0] = ctypes.addressof(mt)
        return 0

    def on_delete(self, addr):
        self.deleted += 1
        del self.live[addr]

    def held_type(self):
        table = self

        class Held:
            __dlpack_c_exchange_api__ = table.capsule

            def __init__(self, t):
                self.t = t
                self.shape = (ctypes.c_int64 * t.dim())(*t.shape)

        return Held


def export_held(obj):
    return torch._C._to_dlpack_versioned(obj.t)


def held_call(Held, a, activation="relu"):
    return _C.ffn_key(*(None if a[n] is None else Held(a[n]) for n in ORDER), activation)


@pytest.mark.parametrize("describe", [True, False])
def test_a_table_describing_in_place_or_exporting_owned_tensors(describe):
    """A table that describes tensors in place is used without any deletion; one without the describing
    function exports an owning tensor per argument, which C deletes exactly once. Either way ffn_key
    answers as for the same torch tensors."""
    a = tensors()
    want = _C.ffn_key(*(a[n] for n in ORDER), "relu")                # torch's tensors, registered as usual
    table = Table(describe=describe)
    Held = table.held_type()
    assert _C.register_tensor_type(Held, export_held, (Held,)) == (1, 3)
    assert _C.tensor_intake()["describe"] is describe
    before = _C.tensor_intake()
    key = held_call(Held, a)
    assert moved(before) == (3, 0)
    assert table.calls == ["describe" if describe else "export"] * 3
    assert (table.deleted, len(table.live)) == ((0 if describe else 3), 0)
    assert key == want
    bad = dict(a, w_up=a["w_up"][:, :-1].contiguous())
    with pytest.raises(ValueError, match="w_up: expected shape"):
        held_call(Held, bad)
    assert len(table.live) == 0


def test_a_failing_table_falls_back_to_the_exporter():
    """Where the table cannot take an object, the registered exporter's capsule is taken instead."""
    table = Table(fail=True)
    Held = table.held_type()
    _C.register_tensor_type(Held, export_held, (Held,))
    a = tensors()
    before = _C.tensor_intake()
    key = held_call(Held, a)
    assert moved(before) == (0, 3) and table.calls == ["describe"] * 3
    _C.register_tensor_type(Held, None, (Held,))
    with pytest.raises(TypeError, match="x: no exporter is registered"):
        held_call(Held, a)
    _C.register_tensor_type(Held, export_held)                       # no exchange types: the exporter only
    assert held_call(Held, a) == key


def test_exact_types_only_and_major_versions():
    """Only exact instances of the exchange types are described (a subclass is exported); a table of
    another major version is not used, unless it points to one of major version 1."""
    table = Table()
    Held = table.held_type()

    class SubHeld(Held):
        pass

    _C.register_tensor_type(Held, export_held, (Held,))
    a = tensors()
    before = _C.tensor_intake()
    held_call(SubHeld, a)
    assert moved(before) == (0, 3) and table.calls == []
    newer = Table(major=2)
    NewHeld = newer.held_type()
    assert _C.register_tensor_type(NewHeld, export_held, (NewHeld,)) is None
    before = _C.tensor_intake()
    held_call(NewHeld, a)
    assert moved(before) == (0, 3) and newer.calls == []
    older = Table()
    chained = Table(major=2, prev=older)
    ChainedHeld = chained.held_type()
    assert _C.register_tensor_type(ChainedHeld, export_held, (ChainedHeld,)) == (1, 3)
    held_call(ChainedHeld, a)
    assert older.calls == ["describe"] * 3 and chained.calls == []

    class OtherHeld(Held):
        __dlpack_c_exchange_api__ = Table().capsule

    with pytest.raises(ValueError, match="OtherHeld carries another DLPack exchange API than Held"):
        _C.register_tensor_type(Held, export_held, (Held, OtherHeld))

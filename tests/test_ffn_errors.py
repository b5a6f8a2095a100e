"""Every bad input to fuser.ffn raises a specific exception that names the argument, the expected and
the actual value; none crashes, and the valid edge cases (M = 0, 1-D x, grad-requiring inputs) work."""
import pytest
import torch

import fuser
from dlpack_producer import KDLCUDA, FakeExporter, Producer

K, N, L, M = 16, 48, 24, 5


@pytest.fixture(autouse=True, params=["exchange", "capsule", "__dlpack__"])
def export_path(request, monkeypatch):
    """Every check here runs the three ways fuser.ffn hands torch tensors to C: through torch's DLPack C
    exchange API (the fast path: no capsule), as capsules from torch's own exporter (torch builds without
    that API) and through __dlpack__ (torch builds without either)."""
    import fuser.interop
    import fuser.ops
    import fuser.route
    from fuser import _C
    if request.param == "exchange" and _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API (Tensor.__dlpack_c_exchange_api__)")
    if request.param == "__dlpack__":
        monkeypatch.setattr(fuser.interop, "to_capsule", None)
    elif fuser.interop.to_capsule is None:
        pytest.skip("this torch has no torch._C._to_dlpack_versioned; only the __dlpack__ path exists")
    monkeypatch.setattr(fuser.ops, "_keyed", fuser.interop.register(exchange=request.param == "exchange"))
    # routes kept from other tests (eager routes are never stale): every call here is validated again
    fuser.route.forget()
    fuser.ops._routes.clear()
    yield request.param
    monkeypatch.undo()
    fuser.interop.register()
    fuser.route.forget()
    fuser.ops._routes.clear()


def args(dtype=torch.bfloat16, gated=False, bias=False):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    a = dict(x=r(M, K), w_up=r(N, K), w_down=r(L, N))
    if gated:
        a["w_gate"] = r(N, K)
    if bias:
        a.update(b_up=r(N), b_down=r(L))
        if gated:
            a["b_gate"] = r(N)
    return a


def call(**over):
    a = args(gated="w_gate" in over or "b_gate" in over)
    a.update(over)
    return fuser.ffn(**a)


def test_valid_baseline():
    assert call().shape == (M, L)


@pytest.mark.parametrize("name", ["x", "w_up", "w_down"])
def test_wrong_dtype(name):
    a = args()
    a[name] = a[name].double()
    with pytest.raises(TypeError, match=rf"{name}: dtype float64 is not supported; expected bfloat16, float16 or float32"):
        fuser.ffn(**a)
    a[name] = a[name].to(torch.int32)
    with pytest.raises(TypeError, match=rf"{name}: dtype int32"):
        fuser.ffn(**a)


@pytest.mark.parametrize("name", ["w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down"])
def test_mixed_dtypes(name):
    a = args(gated=True, bias=True)
    a[name] = a[name].half()
    with pytest.raises(TypeError, match=rf"{name}: dtype float16 does not match x's dtype bfloat16"):
        fuser.ffn(**a)


@pytest.mark.parametrize("name,shape,match", [
    ("w_up", (N, K + 1), r"w_up: expected shape \[d_ff, 16\].*got \[48, 17\]"),
    ("w_up", (N,), r"w_up: expected shape \[d_ff, 16\].*got \[48\]"),
    ("w_up", (1, N, K), r"w_up: expected shape \[d_ff, 16\].*got \[1, 48, 16\]"),
    ("w_down", (L, N + 2), r"w_down: expected shape \[d_out, 48\].*got \[24, 50\]"),
    ("w_down", (N, L), r"w_down: expected shape \[d_out, 48\].*got \[48, 24\]"),
    ("w_gate", (N + 1, K), r"w_gate: expected shape \[48, 16\] \(the same shape as w_up\), got \[49, 16\]"),
    ("b_up", (N + 1,), r"b_up: expected shape \[48\] \(\[d_ff\]\), got \[49\]"),
    ("b_up", (1, N), r"b_up: expected shape \[48\]"),
    ("b_gate", (K,), r"b_gate: expected shape \[48\]"),
    ("b_down", (N,), r"b_down: expected shape \[24\] \(\[d_out\]\), got \[48\]"),
])
def test_wrong_shapes(name, shape, match):
    a = args(gated=True, bias=True)
    a[name] = torch.randn(*shape).bfloat16()
    with pytest.raises(ValueError, match=match):
        fuser.ffn(**a)


def test_zero_sized_and_degenerate_inputs():
    a = args()
    a["x"] = torch.randn(0, K).bfloat16()
    assert fuser.ffn(**a).shape == (0, L)  # an empty batch is handled
    a["x"] = torch.randn(K).bfloat16()
    assert fuser.ffn(**a).shape == (L,)  # a 1-D x is one token
    a["x"] = torch.randn(2, 3, 4, K).bfloat16()
    assert fuser.ffn(**a).shape == (2, 3, 4, L)  # leading dimensions are tokens
    a["x"] = torch.tensor(1.0).bfloat16()
    with pytest.raises(ValueError, match="x: expected a tensor of shape \\[..., d_model\\]"):
        fuser.ffn(**a)
    with pytest.raises(ValueError, match="d_model\\) is 0"):
        fuser.ffn(torch.randn(3, 0).bfloat16(), torch.randn(N, 0).bfloat16(), torch.randn(L, N).bfloat16())
    with pytest.raises(ValueError, match="w_up: expected shape .*d_ff >= 1"):
        fuser.ffn(torch.randn(3, K).bfloat16(), torch.randn(0, K).bfloat16(), torch.randn(L, 0).bfloat16())
    with pytest.raises(ValueError, match="w_down: expected shape .*d_out >= 1"):
        fuser.ffn(torch.randn(3, K).bfloat16(), torch.randn(N, K).bfloat16(), torch.randn(0, N).bfloat16())


@pytest.mark.parametrize("name,make", [
    ("x", lambda a: torch.randn(K, M).bfloat16().t()),
    ("x", lambda a: torch.randn(M, 2 * K).bfloat16()[:, ::2]),
    ("w_up", lambda a: torch.randn(K, N).bfloat16().t()),
    ("w_down", lambda a: torch.randn(L, 2 * N).bfloat16()[:, N:]),
    ("b_up", lambda a: torch.randn(2 * N).bfloat16()[::2]),
])
def test_non_contiguous(name, make):
    a = args(bias=True)
    a[name] = make(a)
    with pytest.raises(ValueError, match=rf"{name}: strides .* are not contiguous row-major; pass {name}.contiguous\(\)"):
        fuser.ffn(**a)


def test_unaligned():
    a = args()
    a["x"] = torch.randn(M * K + 1).bfloat16()[1:].view(M, K)  # starts 2 bytes into the allocation
    with pytest.raises(ValueError, match="x: data address 0x[0-9a-f]+ is not 16-byte aligned"):
        fuser.ffn(**a)


def test_tensors_on_different_devices():
    """Without a GPU, a DLPack producer that claims CUDA stands in for a CUDA tensor."""
    p = Producer()
    a = args(dtype=torch.float32)
    a["w_down"] = FakeExporter(p, device=(KDLCUDA, 0), shape=(L, N), dtype="float32")
    with pytest.raises(ValueError, match="w_down is on cuda:0 but x is on cpu"):
        fuser.ffn(**a)
    assert p.deleted == 1


@pytest.mark.parametrize("activation,exc,match", [
    ("swish", ValueError, r"activation: unknown activation 'swish'; expected one of relu, gelu, gelu_tanh, silu"),
    ("GELU", ValueError, "unknown activation 'GELU'"),
    ("", ValueError, "unknown activation ''"),
    (3, TypeError, "activation: expected a str"),
])
def test_unknown_activation(activation, exc, match):
    with pytest.raises(exc, match=match):
        call(activation=activation)


def test_capsules_and_non_tensors():
    a = args()
    a["x"] = a["x"].__dlpack__(max_version=(1, 0))
    with pytest.raises(TypeError, match="x: got a raw DLPack capsule"):
        fuser.ffn(**a)
    a = args()
    cap = torch.utils.dlpack.to_dlpack(a["w_up"])
    torch.from_dlpack(cap)  # consumed
    a["w_up"] = cap
    with pytest.raises(TypeError, match="w_up: got a raw DLPack capsule"):
        fuser.ffn(**a)
    for bad in ([[1.0] * K] * M, "x", 1.5):
        a = args()
        a["x"] = bad
        with pytest.raises(TypeError, match="x: expected a tensor"):
            fuser.ffn(**a)


def test_b_gate_without_w_gate():
    a = args()
    a["b_gate"] = torch.randn(N).bfloat16()
    with pytest.raises(ValueError, match="b_gate: given without w_gate"):
        fuser.ffn(**a)


def test_out_checks():
    a = args()
    with pytest.raises(ValueError, match=r"out: expected shape \[5, 24\] .*got \[5, 16\]"):
        fuser.ffn(out=torch.empty(M, K).bfloat16(), **a)
    with pytest.raises(ValueError, match=r"out: expected shape \[5, 24\]"):
        fuser.ffn(out=torch.empty(M * L).bfloat16(), **a)
    with pytest.raises(TypeError, match="out: dtype float32 does not match"):
        fuser.ffn(out=torch.empty(M, L), **a)
    # out aliasing an input: x itself (d_out == d_model here), and a view into w_up's memory
    a2 = args()
    a2["w_down"] = torch.randn(K, N).bfloat16()
    with pytest.raises(ValueError, match="out: its memory overlaps x"):
        fuser.ffn(out=a2["x"], **a2)
    with pytest.raises(ValueError, match="out: its memory overlaps w_up"):
        fuser.ffn(out=a["w_up"].view(-1)[: M * L].view(M, L), **a)


def test_grad_requiring_inputs_are_passed_as_detached_views():
    a = {k: v.float().requires_grad_() for k, v in args().items()}
    y = fuser.ffn(**a)
    assert y.requires_grad
    with pytest.raises(ValueError, match="out= does not support autograd"):
        fuser.ffn(out=torch.empty(M, L), **a)
    with torch.no_grad():
        out = torch.empty(M, L)
        assert fuser.ffn(out=out, **a) is out


def test_fused_route_prepares_its_launch_once_and_then_passes_only_addresses(monkeypatch):
    """The glue between a fused route and its launch, on CPU with the launch stubbed: the route prepares
    one launch per stream, token count and weight addresses from one DLPack object per tensor in schema
    order (x, then w_up, w_down, w_gate, b_up, b_gate, b_down; y writable), holding no weights, with the
    scratch sized for the token count on the caller's stream; each call then runs it with the addresses
    of that call's tensors. New weights prepare again; a replaced scratch too."""
    import fuser.route
    from fuser import _C
    from fuser.route import FusedRoute
    prepared, runs = [], []

    class FakeLaunch:
        def scratch(self, m, stream):
            return kept[(0, stream)]

        def prepare(self, x, weights, activation, y, scratch, stream, borrow=0, keep=True):
            prepared.append(dict(activation=activation, scratch=scratch, stream=stream, keep=keep,
                                 data=[None if t is None else _C.dlpack_info(t, writable=i == 7)["data"]
                                       for i, t in enumerate((x, *weights, y))]))
            return f"PREPARED{len(prepared)}"

    kept = {(0, 0x1234): ("SCRATCH", M)}
    route = FusedRoute.__new__(FusedRoute)
    route.plan, route.stale, route.device, route.launch, route.prepared = "PLAN", False, 0, FakeLaunch(), {}
    route.same_shape = L == K
    monkeypatch.setattr(fuser.route, "_raw_stream", lambda device: 0x1234)
    monkeypatch.setattr(fuser.route, "_current_device", lambda: 0)
    monkeypatch.setattr(fuser.route, "_scratch_get", kept.get)
    # what C reads of each argument: an int or None as it is, a tensor's data_ptr()
    monkeypatch.setattr(fuser.route, "_ffn_run", lambda *a: runs.append(
        tuple(v if v is None or isinstance(v, (int, str)) else v.data_ptr() for v in a)))
    a = args(gated=True, bias=True)
    order = ("w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")
    x3 = a["x"].reshape(1, M, K)
    with torch.no_grad():
        ys = [route.run(x3, *(a[k] for k in order), "silu") for _ in range(2)]
        assert ys[0].shape == (1, M, L) and len(prepared) == 1
        p = prepared[0]
        assert (p["activation"], p["scratch"], p["stream"], p["keep"]) == ("silu", ("SCRATCH", M), 0x1234, False)
        assert p["data"] == [a["x"].data_ptr()] + [a[k].data_ptr() for k in order] + [ys[0].data_ptr()]
        assert len(runs) == 2
        for y, run in zip(ys, runs):
            assert run == ("PREPARED1", a["x"].data_ptr(), y.data_ptr(), *(a[k].data_ptr() for k in order))
        w_up2 = a["w_up"].clone()                                 # another layer's weights: prepared for them
        route.run(x3, w_up2, *(a[k] for k in order[1:]), "silu")
        assert len(prepared) == 2 and runs[-1][0] == "PREPARED2" and runs[-1][3] == w_up2.data_ptr()
        kept[(0, 0x1234)] = ("BIGGER", M)                         # the stream's scratch was replaced
        route.run(x3, *(a[k] for k in order), "silu")
        assert len(prepared) == 3 and runs[-1][0] == "PREPARED3" and prepared[-1]["scratch"] == ("BIGGER", M)
        # where d_out is d_model the route allocates y as empty_like(x): x's shape, row-major, a fresh tensor
        route.same_shape = True
        wd_square = torch.randn(K, N).to(a["w_down"].dtype)
        y = route.run(x3, a["w_up"], wd_square, *(a[k] for k in order[2:]), "silu")
        assert y.shape == x3.shape and y.is_contiguous() and y.dtype == x3.dtype and y.data_ptr() != x3.data_ptr()
        assert runs[-1][2] == y.data_ptr()


def test_route_key_validates_as_ffn_check_does(export_path):
    """``_C.ffn_key``, the check every call of torch tensors passes, refuses what ``_C.ffn_check``
    refuses, with the same exception and message, and keys equal chains alike: torch tensors read
    through torch's DLPack C exchange API, or exported in C to capsules of torch's exporter where that
    API is not used (ffn_check gets those capsules here). Objects that are not torch tensors, raw
    capsules included, are refused: fuser.ffn's general path judges them."""
    from fuser import _C
    if export_path == "__dlpack__":
        pytest.skip("ffn_key takes torch tensors only where torch exports them without __dlpack__")
    before = _C.tensor_intake()
    a = args(gated=True, bias=True)
    bad = [dict(x=a["x"][:, :-1]), dict(w_up=a["w_up"].t().contiguous()), dict(w_down=a["w_down"].float()),
           dict(w_gate=torch.randn(N, K + 1, dtype=torch.bfloat16)), dict(b_up=a["b_up"][1:]),
           dict(b_down=torch.randn(2 * L, dtype=torch.bfloat16)[::2]), dict(w_up=torch.randn(N * K + 1).to(
               torch.bfloat16)[1:].view(N, K)), dict(activation="swish"), dict(x=torch.randn(M, K, dtype=torch.float64))]
    order = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")
    for over in bad:
        b = {**a, "activation": "silu", **over}
        with pytest.raises(Exception) as want:
            _C.ffn_check(*(None if b[n] is None else torch._C._to_dlpack_versioned(b[n]) for n in order),
                         activation=b["activation"], capsules=0x7f)
        with pytest.raises(type(want.value)) as got:
            _C.ffn_key(*(b[n] for n in order), b["activation"])
        assert str(got.value) == str(want.value), over
    key = _C.ffn_key(*(a[n] for n in order), "silu")
    assert key == _C.ffn_key(*(a[n].clone() for n in order), "silu")
    assert key != _C.ffn_key(*(a[n] for n in order), "relu")
    assert key != _C.ffn_key(a["x"][:2], *(a[n] for n in order[1:]), "silu")     # tokens
    after = _C.tensor_intake()
    exchanged, exported = after["exchanged"] - before["exchanged"], after["exported"] - before["exported"]
    assert (exchanged > 0, exported > 0) == ((True, False) if export_path == "exchange" else (False, True))
    with pytest.raises(TypeError, match="w_up: expected a Tensor, got numpy.ndarray"):
        _C.ffn_key(a["x"], a["w_up"].float().numpy(), a["w_down"], None, None, None, None, "silu")
    with pytest.raises(TypeError, match="w_down: got a raw DLPack capsule"):
        _C.ffn_key(a["x"], a["w_up"], torch._C._to_dlpack_versioned(a["w_down"]), None, None, None, None, "silu")


def test_a_kept_route_is_reused_yet_every_call_is_validated(monkeypatch, export_path):
    """After the first call of a route key, fuser.ffn runs the kept route without the general check;
    a later call whose tensors are not valid (here a weight of the same shape, not contiguous, and one
    not 16-byte aligned) is refused with the general check's error."""
    import fuser.ops
    checks = []
    real = fuser.ops._check
    monkeypatch.setattr(fuser.ops, "_check", lambda *a, **k: checks.append(1) or real(*a, **k))
    a = args(dtype=torch.float32)
    r = fuser.ops.route(a["x"], a["w_up"], a["w_down"], activation="relu")
    assert checks == [1]
    torch.testing.assert_close(fuser.ffn(**a, activation="relu"),
                               fuser.ffn_reference(**a, activation="relu"))
    assert fuser.ops.route(a["x"], a["w_up"], a["w_down"], activation="relu") is r
    kept = 3 if export_path == "__dlpack__" else 1       # without torch's exporter every call is checked
    assert len(checks) == kept
    w_up = torch.randn(K, N).t()                         # [N, K], not contiguous
    with pytest.raises(ValueError, match="w_up"):
        fuser.ffn(a["x"], w_up, a["w_down"], activation="relu")
    w_up = torch.randn(N * K + 1)[1:].view(N, K)         # [N, K], 4 bytes past an aligned address
    with pytest.raises(ValueError, match="w_up"):
        fuser.ffn(a["x"], w_up, a["w_down"], activation="relu")

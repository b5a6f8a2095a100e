"""DLPack intake: both capsule kinds, objects with __dlpack__, the consumption rules (rename to used_*,
deleter called exactly once, also on every error path), validation, and no leaks."""
import gc
import os

import pytest
import torch

from fuser import _C
from dlpack_producer import (FLAG_IS_COPIED, FLAG_READ_ONLY, KDLCUDA, FakeExporter, Producer,
                             capsule_name)

TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 8), (0, 4), (1, 1, 1, 16)])
def test_torch_round_trip_all_kinds(dtype, shape):
    t = torch.randn(*shape).to(dtype)
    for obj, versioned in [(t, True),  # __dlpack__(max_version=(1, 0)) -> versioned
                           (t.__dlpack__(max_version=(1, 0)), True),
                           (torch.utils.dlpack.to_dlpack(t), False)]:
        info = _C.dlpack_info(obj)
        assert info["shape"] == tuple(shape)
        assert info["dtype"] == TORCH_DTYPES[dtype]
        assert info["device"] == "cpu"
        assert info["versioned"] is versioned
        assert info["numel"] == t.numel() and info["nbytes"] == t.numel() * t.element_size()
        if t.numel():
            assert info["data"] == t.data_ptr()


def test_views_with_offsets_and_size_one_strides():
    base = torch.randn(64, 32)
    view = base[8:16]  # storage offset 8 rows = 1024 bytes: aligned, contiguous
    assert _C.dlpack_info(view)["data"] == view.data_ptr()
    odd = torch.randn(5, 1, 7)[:, :, :].as_strided((5, 1, 7), (7, 99, 1))  # size-1 dim, any stride
    assert _C.dlpack_info(odd)["shape"] == (5, 1, 7)


@pytest.mark.parametrize("versioned", [True, False])
def test_capsule_is_renamed_and_deleted_once(versioned):
    p = Producer()
    cap, ptr = p.capsule((4, 8), "float16", versioned=versioned)
    info = _C.dlpack_info(cap)
    assert info["data"] == ptr and info["shape"] == (4, 8) and info["dtype"] == "float16"
    assert info["versioned"] is versioned
    assert capsule_name(cap) == ("used_dltensor_versioned" if versioned else "used_dltensor")
    assert p.deleted == 1
    with pytest.raises(ValueError, match="already consumed"):
        _C.dlpack_info(cap)
    del cap
    gc.collect()
    assert p.deleted == 1 and p.live == 0


BAD_CAPSULES = [
    (dict(dtype="float64"), TypeError, "float64"),
    (dict(dtype="int32"), TypeError, "int32"),
    (dict(lanes=2), TypeError, "lanes"),
    (dict(shape=(4, 8), strides=(1, 4)), ValueError, "contiguous"),
    (dict(shape=(4, 8), strides=(16, 1)), ValueError, "contiguous"),
    (dict(byte_offset=4), ValueError, "aligned"),
    (dict(null_data=True), ValueError, "NULL"),
    (dict(shape=(2, -3)), ValueError, "negative"),
    (dict(shape=(1,) * 9), ValueError, "dimensions"),
    (dict(device=(13, 0)), ValueError, "managed"),
    (dict(device=(8, 0)), ValueError, "device type 8"),
    (dict(version=(2, 0)), ValueError, "version 2.0"),
]


@pytest.mark.parametrize("kw,exc,match", BAD_CAPSULES)
def test_bad_capsules_raise_and_still_delete_once(kw, exc, match):
    p = Producer()
    versioned = kw.pop("versioned", True)
    cap, _ = p.capsule(versioned=versioned, **kw)
    with pytest.raises(exc, match=match):
        _C.dlpack_info(cap)
    assert p.deleted == 1, "the deleter must run exactly once, also on error paths"
    assert capsule_name(cap).startswith("used_")


@pytest.mark.parametrize("flags,match", [(FLAG_READ_ONLY, "read-only"), (FLAG_IS_COPIED, "copy")])
def test_writable_refuses_read_only_and_copies(flags, match):
    p = Producer()
    cap, _ = p.capsule(flags=flags)
    with pytest.raises(ValueError, match=match):
        _C.dlpack_info(cap, writable=True)
    assert p.deleted == 1
    cap, _ = p.capsule(flags=flags)
    _C.dlpack_info(cap)  # fine for inputs
    assert p.deleted == 2


def test_foreign_capsule_and_non_tensors():
    import datetime
    cap = datetime.datetime_CAPI  # a PyCapsule that is not DLPack
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        _C.dlpack_info(cap)
    for obj in ([1.0, 2.0], 3.0, "x", None, object()):
        with pytest.raises(TypeError, match="expected a tensor"):
            _C.dlpack_info(obj)


def test_exporter_gets_max_version_and_stream():
    p = Producer()
    cpu = FakeExporter(p)
    assert _C.dlpack_info(cpu, stream=1234)["versioned"] is True
    assert cpu.calls == [{"stream": None, "max_version": (1, 0)}], "CPU tensors get stream=None"
    gpu = FakeExporter(p, device=(KDLCUDA, 0))
    assert _C.dlpack_info(gpu, stream=1234)["device"] == "cuda"
    _C.dlpack_info(gpu, stream=0)  # the legacy default stream is spelled 1 in the protocol
    _C.dlpack_info(gpu)
    assert [c["stream"] for c in gpu.calls] == [1234, 1, None]
    assert p.deleted == 4 and p.live == 0


def test_legacy_exporter_without_max_version():
    p = Producer()
    old = FakeExporter(p, legacy_only=True)
    info = _C.dlpack_info(old)
    assert info["versioned"] is False and p.deleted == 1


def test_exporter_errors_name_the_argument():
    t = torch.randn(3, requires_grad=True)   # the producer's BufferError becomes the contract's TypeError
    with pytest.raises(TypeError, match="obj: cannot be taken through DLPack \\(BufferError: .*require"):
        _C.dlpack_info(t)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc to read resident memory")
def test_no_leak_over_10000_calls():
    p = Producer()
    t = torch.randn(64, 64, dtype=torch.bfloat16)
    w = torch.randn(128, 64, dtype=torch.bfloat16)
    w2 = torch.randn(64, 128, dtype=torch.bfloat16)

    def once():
        _C.dlpack_info(t)
        _C.dlpack_info(torch.utils.dlpack.to_dlpack(t))
        cap, _ = p.capsule((8, 8), "bfloat16")
        _C.dlpack_info(cap)
        bad, _ = p.capsule((8, 8), "float64")
        try:
            _C.dlpack_info(bad)
        except TypeError:
            pass
        _C.ffn_check(t, w, w2)
        try:
            _C.ffn_check(t, w2, w2)
        except ValueError:
            pass

    for _ in range(1000):  # warm up allocator pools
        once()
    gc.collect()
    before = _rss_bytes()
    for _ in range(10_000):
        once()
    gc.collect()
    grown = _rss_bytes() - before
    assert p.deleted == 2 * 11_000 and p.live == 0
    assert grown < 2 << 20, f"resident memory grew by {grown} bytes over 10,000 calls"


def test_ffn_check_borrows_the_capsules_fuser_exported_and_refuses_others():
    """fuser.ffn hands torch tensors to C as capsules it exported itself (bit i of `capsules`): the check
    only borrows them (not consumed, not deleted), so the fused launch reads the same capsules again and
    consumes them. A raw capsule anywhere else is refused (it could be read only once)."""
    p = Producer()
    shapes = [(3, 16), (48, 16), (16, 48)]
    caps = [p.capsule(s, "bfloat16", versioned=True)[0] for s in shapes]
    chain = _C.ffn_check(*caps, activation="relu", capsules=0b111)
    assert (chain["m"], chain["d_model"], chain["d_ff"], chain["d_out"]) == (3, 16, 48, 16)
    assert p.deleted == 0 and [capsule_name(c) for c in caps] == ["dltensor_versioned"] * 3
    infos = [_C.dlpack_info(c) for c in caps]            # consumed afterwards: deleted once each
    assert [i["shape"] for i in infos] == shapes and p.deleted == 3
    assert [capsule_name(c) for c in caps] == ["used_dltensor_versioned"] * 3
    caps = [p.capsule(s, "bfloat16", versioned=True)[0] for s in shapes]
    with pytest.raises(TypeError, match="w_down: got a raw DLPack capsule"):
        _C.ffn_check(*caps, activation="relu", capsules=0b011)
    assert p.deleted == 3 and [capsule_name(c) for c in caps] == ["dltensor_versioned"] * 3


def test_ffn_run_refuses_what_is_not_a_prepared_launch_or_an_address():
    """_C.ffn_run checks its arguments before any launch: a prepared launch from ffn_prepare, addresses as
    ints (or None), three or nine arguments."""
    with pytest.raises(TypeError, match="prepared: expected a launch from fuser._C.ffn_prepare"):
        _C.ffn_run(torch._C._to_dlpack_versioned(torch.zeros(2)), 16, 32)
    with pytest.raises(TypeError, match="got 2 arguments"):
        _C.ffn_run(None, 16)
    with pytest.raises(TypeError, match="prepared: expected"):
        _C.ffn_run(None, 16, 32)

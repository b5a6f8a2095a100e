"""An independent DLPack producer for tests, written with ctypes (not fuser's C declarations): it
builds legacy and versioned managed tensors over a numpy buffer, with deleters that count their
calls, so tests can see that fuser consumes capsules by the protocol's rules."""
from __future__ import annotations

import ctypes

import numpy as np

KDLCPU, KDLCUDA = 1, 2
KDLINT, KDLUINT, KDLFLOAT, KDLBFLOAT = 0, 1, 2, 4
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_PyCapsule_GetName = ctypes.pythonapi.PyCapsule_GetName
_PyCapsule_GetName.restype = ctypes.c_char_p
_PyCapsule_GetName.argtypes = [ctypes.py_object]

DTYPES = {  # numpy storage dtype, DLPack (code, bits)
    "float32": (np.float32, KDLFLOAT, 32),
    "float16": (np.float16, KDLFLOAT, 16),
    "bfloat16": (np.uint16, KDLBFLOAT, 16),
    "float64": (np.float64, KDLFLOAT, 64),
    "int32": (np.int32, KDLINT, 32),
}

_NAMES = {False: b"dltensor", True: b"dltensor_versioned"}


class Producer:
    """Makes capsules and counts deleter calls. Keeps every buffer alive until it is deleted."""

    def __init__(self):
        self.deleted = 0
        self._live = {}
        self._deleter = DELETER(self._on_delete)

    def _on_delete(self, addr):
        self.deleted += 1
        self._live.pop(addr, None)

    @property
    def live(self):
        return len(self._live)

    def capsule(self, shape=(4, 8), dtype="float32", *, versioned=True, strides=None, byte_offset=0,
                device=(KDLCPU, 0), version=(1, 0), flags=0, null_data=False, lanes=1):
        np_dtype, code, bits = DTYPES[dtype]
        n = int(np.prod(shape)) if shape else 1
        buf = np.zeros(n * np.dtype(np_dtype).itemsize + 512 + byte_offset, dtype=np.uint8)
        base = buf.ctypes.data
        base += (-base) % 256  # aligned start, so byte_offset alone decides alignment
        shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        strides_arr = (ctypes.c_int64 * max(len(shape), 1))(*strides) if strides is not None else None
        mt = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        t = mt.dl_tensor
        t.data = None if null_data else base
        t.device = DLDevice(*device)
        t.ndim = len(shape)
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr else None
        t.byte_offset = byte_offset
        mt.deleter = self._deleter
        if versioned:
            mt.version = DLPackVersion(*version)
            mt.flags = flags
        addr = ctypes.addressof(mt)
        self._live[addr] = (mt, buf, shape_arr, strides_arr)
        cap = _PyCapsule_New(addr, _NAMES[versioned], None)
        return cap, base + byte_offset


def capsule_name(cap):
    return _PyCapsule_GetName(cap).decode()


class FakeExporter:
    """An object with __dlpack__/__dlpack_device__ that records the arguments it was called with."""

    def __init__(self, producer, *, device=(KDLCPU, 0), legacy_only=False, **kw):
        self.producer, self.device, self.legacy_only, self.kw = producer, device, legacy_only, kw
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, **extra):
        if self.legacy_only and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append({"stream": stream, "max_version": max_version})
        versioned = max_version is not None and max_version[0] >= 1
        cap, _ = self.producer.capsule(device=self.device, versioned=versioned, **self.kw)
        return cap

"""What fuser asks of torch on every call, each in its cheapest form: torch tensors handed to C, the
current CUDA device and stream, tensors made ready for the kernels, and the ``FUSER_DISABLE`` switch.

The fast forms are torch's own C entry points (what Inductor's generated code calls), taken when this
torch has them: a capsule in ~0.2 us where ``Tensor.__dlpack__`` takes ~1.7 us, the raw stream in
~0.1 us where ``torch.cuda.current_stream(d).cuda_stream`` builds a Stream object. Cheapest of all,
the per-call check ``_C.ffn_key`` takes torch tensors themselves: ``torch.Tensor`` is registered with
the C binding at import (``_C.register_tensor_type``), which reads plain tensors and Parameters through
torch's DLPack C exchange API (``Tensor.__dlpack_c_exchange_api__``, DLPack 1.3: a C function that
describes a tensor in place, no capsule, no Python call) and asks torch's exporter for a capsule of
anything else that is a torch tensor (subclasses: their Python-level behaviour is theirs to keep).
"""
from __future__ import annotations

import contextlib
import os

import torch

from fuser import _C

__all__ = ["export", "ready", "placement", "disabled", "register"]

#: torch's exporter behind ``Tensor.__dlpack__`` (None in torch builds without it). fuser always names
#: the tensor's current stream, so skipping ``__dlpack__``'s stream handshake changes nothing.
to_capsule = getattr(torch._C, "_to_dlpack_versioned", None)
#: torch's current raw stream (a cudaStream_t as an int) of a device index
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
#: the current CUDA device's index
current_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
#: The types whose exact instances C reads through torch's DLPack C exchange API: torch's own plain
#: tensor and Parameter (which only marks a tensor as a module's weight); any other subclass may give its
#: tensors a Python-level meaning, so it gets a capsule from ``to_capsule`` as before.
EXCHANGE_TYPES = (torch.Tensor, torch.nn.Parameter)


def register(exchange=True):
    """Register ``torch.Tensor`` with the C binding (``_C.register_tensor_type``), reading
    ``EXCHANGE_TYPES`` through torch's DLPack C exchange API where `exchange` and this torch has one.
    True where ``_C.ffn_key`` then takes torch tensors (through the exchange API or ``to_capsule``).
    Done once at import; tests call it to take the other path.

    Example:
        >>> from fuser import _C, interop
        >>> interop.register() == (interop.to_capsule is not None or _C.tensor_intake()["version"] is not None)
        True
    """
    try:
        _C.register_tensor_type(torch.Tensor, to_capsule, EXCHANGE_TYPES if exchange else ())
    except (TypeError, ValueError):   # an attribute that is not the protocol's capsule: capsules only
        _C.register_tensor_type(torch.Tensor, to_capsule)
    return to_capsule is not None or _C.tensor_intake()["version"] is not None


#: True where ``_C.ffn_key`` takes torch tensors (``register``)
keyed = register()

_NO_GUARD = contextlib.nullcontext()


def export(t):
    """What ``fuser._C`` takes for a torch tensor: a DLPack capsule, or where this torch cannot export one
    that way a detached view (C then calls its ``__dlpack__``, which refuses tensors that require grad).

    Example:
        >>> import torch
        >>> from fuser.interop import export
        >>> type(export(torch.zeros(2))).__name__ in ("PyCapsule", "Tensor")
        True
    """
    if to_capsule is not None:
        return to_capsule(t)
    return t.detach()


def ready(t):
    """``t`` as the fused kernels take it: contiguous and 16-byte aligned (copied only when it is not).

    Example:
        >>> import torch
        >>> from fuser.interop import ready
        >>> x = torch.randn(4, 3).t()
        >>> ready(x).is_contiguous(), torch.equal(ready(x), x)
        (True, True)
    """
    t = t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


def placement(x):
    """(x's CUDA device index, the caller's current stream on it, a guard making that device current)
    for a CUDA torch tensor; (None, None, a no-op guard) for anything else. The guard switches devices
    only when x is not on the current one (``torch.cuda.device`` costs ~2 us even when it need not).

    Example:
        >>> import torch
        >>> from fuser.interop import placement
        >>> placement(torch.zeros(1))[:2]
        (None, None)
    """
    if isinstance(x, torch.Tensor) and x.is_cuda:
        dev = x.get_device()
        return dev, raw_stream(dev), (_NO_GUARD if dev == current_device() else torch.cuda.device(dev))
    return None, None, _NO_GUARD


# FUSER_DISABLE is read at every call (it may be set mid-session), from os.environ's own store: ~0.05 us
# where os.environ.get encodes and decodes (~0.5 us). Each raw value seen is parsed once, by the C core's
# parser of boolean variables (the one FUSER_CACHE_DISABLE uses), and remembered.
try:
    _ENV, _DISABLE_KEY = os.environ._data, os.environ.encodekey("FUSER_DISABLE")
    _decode = os.environ.decodevalue
except AttributeError:  # not CPython's os._Environ
    _ENV = None
_parsed = {}  # raw value -> bool; a value that is not a boolean is not kept (it raises every time)


def disabled():
    """True when ``FUSER_DISABLE`` asks for the PyTorch ops everywhere: 1, true, yes or on (any case).
    0, false, no, off, empty or unset leave fuser on; any other value raises ``ValueError`` naming the
    variable, the value and these spellings.

    Example:
        >>> import os
        >>> from fuser.interop import disabled
        >>> os.environ["FUSER_DISABLE"] = "false"; disabled()
        False
        >>> os.environ["FUSER_DISABLE"] = "On"; disabled()
        True
        >>> del os.environ["FUSER_DISABLE"]; disabled()
        False
    """
    if _ENV is None:
        return _C.parse_flag("FUSER_DISABLE", os.environ.get("FUSER_DISABLE"))
    v = _ENV.get(_DISABLE_KEY)
    if v is None:
        return False
    on = _parsed.get(v)
    if on is None:
        on = _parsed[v] = _C.parse_flag("FUSER_DISABLE", _decode(v))
    return on

"""fuser.jit: compile CUDA source for Hopper (sm_90a) with NVRTC, through fuser's on-disk kernel cache.

The C core does the work (``csrc/jit.c``, ``csrc/cache.c``): NVRTC gets the kernel templates embedded
in the extension as in-memory headers (``#include "fuser/device/common.cuh"`` works with no CUDA
toolkit installed), produces a CUBIN, and ptxas' report gives registers, spills and shared memory.
Results are cached under :func:`cache_dir` keyed by everything that changes the binary, so a second
compile of the same source (in any process) is a file read and needs no NVRTC at all.

Environment: ``$FUSER_CACHE_DIR`` moves the cache, ``$FUSER_CACHE_DISABLE=1`` (a boolean: 1/0,
true/false, yes/no, on/off) turns it off, ``$FUSER_NVRTC`` names the libnvrtc to use. A directory that
another user owns or that others may write is refused (the README's "The kernel cache" says how the
directory is chosen and checked): a one-time ``RuntimeWarning`` says why, and kernels are compiled and
kept in memory only.
"""
from __future__ import annotations

import dataclasses
import warnings

from fuser import _C
from fuser._C import CacheError
from fuser._env import nvrtc_wheel_dirs

_warned = set()  # the reasons a cache directory was refused that this process has warned about


def _warn_refused(why, stacklevel):
    """Warn once per reason that the disk cache is not used."""
    if why not in _warned:
        _warned.add(why)
        warnings.warn(f"fuser: {why}", RuntimeWarning, stacklevel=stacklevel + 1)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled module and what ptxas said about it.

    ``registers`` and ``shared_bytes`` are the most of any kernel in the module; ``spill_bytes`` counts
    spill stores plus spill loads over every function (0: nothing spills). ``kernels`` has the same
    numbers per ``__global__`` function. ``cache_state`` is ``"hit"`` (read from disk, NVRTC not
    called), ``"stored"``, ``"disabled"``, ``"not_stored"`` (the compile is valid but the entry could
    not be written; ``cache_note`` says why) or ``"refused"`` (the cache directory is unsafe or its path
    too long: nothing was read or written there; ``cache_note`` says why).
    """

    cubin: bytes
    log: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    cache_hit: bool
    key: str
    kernels: tuple = ()
    cache_state: str = ""
    cache_note: str = ""


def compile_source(source, name, options=()):
    """Compile CUDA C++ ``source`` for sm_90a, or fetch it from the kernel cache.

    Args:
        source: one translation unit. It may include the embedded templates (``"fuser/device/..."``)
            but nothing from a CUDA toolkit; declare kernels ``extern "C"`` to keep their names.
        name: its file name in diagnostics, e.g. ``"ffn.cu"``.
        options: NVRTC options added after fuser's own (``--gpu-architecture=sm_90a -std=c++17
            -default-device --ptxas-options=-v``), e.g. ``("-lineinfo", "-DTILE=128")``.

    Returns:
        a :class:`Compiled`.

    Raises:
        fuser.CompileError: NVRTC rejected the source; ``.log`` holds the full log.
        fuser.CudaError: NVRTC is not installed and the cache has no entry for this source.
        ValueError: ``$FUSER_CACHE_DISABLE`` is not a boolean.

    A cache entry that cannot be written is not an error: a ``RuntimeWarning`` says why. Nor is a
    cache directory fuser must not use: a ``RuntimeWarning``, once per reason, says why.

    Example:
        >>> from fuser import jit
        >>> src = 'extern "C" __global__ void fill(float *p) { p[threadIdx.x] = 1.0f; }'
        >>> k = jit.compile_source(src, "fill.cu")        # doctest: +SKIP
        >>> k.cubin[:4], k.kernels[0]["name"], k.spill_bytes  # doctest: +SKIP
        (b'\\x7fELF', 'fill', 0)
    """
    d = _C.jit_compile(source, name, tuple(options), nvrtc_dirs=nvrtc_wheel_dirs())
    if d["cache_state"] == "not_stored":
        warnings.warn(f"fuser: compiled {name} but could not store it in the kernel cache: {d['cache_note']}",
                      RuntimeWarning, stacklevel=2)
    elif d["cache_state"] == "refused":
        _warn_refused(d["cache_note"], stacklevel=2)
    return Compiled(cubin=d["cubin"], log=d["log"], registers=d["registers"], spill_bytes=d["spill_bytes"],
                    shared_bytes=d["shared_bytes"], cache_hit=d["cache_hit"], key=d["key"],
                    kernels=tuple(d["kernels"]), cache_state=d["cache_state"], cache_note=d["cache_note"])


def cache_dir():
    """The kernel cache directory: ``$FUSER_CACHE_DIR``, else ``$XDG_CACHE_HOME/fuser``, else
    ``~/.cache/fuser``, else (no ``$HOME``) ``$TMPDIR/fuser-<uid>`` or ``/tmp/fuser-<uid>``. Entries
    live under its ``v2/``; deleting the directory is always safe. It is only where fuser looks:
    :func:`usable_cache_dir` says whether fuser may use it.

    Raises:
        fuser.CacheError: the path is longer than fuser takes (1,023 bytes); it is never cut.

    Example:
        >>> from fuser import jit
        >>> isinstance(jit.cache_dir(), str)
        True
    """
    return _C.cache_dir()


def usable_cache_dir(create=False):
    """The kernel cache directory, if fuser may read and write it; with ``create``, a missing one is
    made private to the user (mode 0700).

    Raises:
        fuser.CacheError: fuser must not use it: its path is too long, or it is not a directory,
            belongs to another user, or group or others may write it. A ``RuntimeWarning`` says so
            once per reason.

    Example:
        >>> from fuser import jit
        >>> jit.usable_cache_dir() == jit.cache_dir()  # a directory of this user's, or none yet
        True
    """
    try:
        return _C.cache_root(create=create)
    except CacheError as e:
        _warn_refused(str(e), stacklevel=2)
        raise

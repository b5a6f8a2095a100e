"""fuser.jit: compile CUDA source for Hopper (sm_90a) with NVRTC, through fuser's on-disk kernel cache.

The C core does the work (``csrc/jit.c``, ``csrc/cache.c``): NVRTC gets the kernel templates embedded
in the extension as in-memory headers (``#include "fuser/device/common.cuh"`` works with no CUDA
toolkit installed), produces a CUBIN, and ptxas' report gives registers, spills and shared memory.
Results are cached under :func:`cache_dir` keyed by everything that changes the binary, so a second
compile of the same source (in any process) is a file read and needs no NVRTC at all.

Environment: ``$FUSER_CACHE_DIR`` moves the cache, ``$FUSER_CACHE_DISABLE=1`` turns it off,
``$FUSER_NVRTC`` names the libnvrtc to use.
"""
from __future__ import annotations

import dataclasses
import warnings

from fuser import _C
from fuser._env import nvrtc_wheel_dirs


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled module and what ptxas said about it.

    ``registers`` and ``shared_bytes`` are the most of any kernel in the module; ``spill_bytes`` counts
    spill stores plus spill loads over every function (0: nothing spills). ``kernels`` has the same
    numbers per ``__global__`` function. ``cache_state`` is ``"hit"`` (read from disk, NVRTC not
    called), ``"stored"``, ``"disabled"`` or ``"not_stored"`` (the compile is valid but the entry could
    not be written; ``cache_note`` says why).
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

    A cache entry that cannot be written is not an error: a ``RuntimeWarning`` says why.

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
    return Compiled(cubin=d["cubin"], log=d["log"], registers=d["registers"], spill_bytes=d["spill_bytes"],
                    shared_bytes=d["shared_bytes"], cache_hit=d["cache_hit"], key=d["key"],
                    kernels=tuple(d["kernels"]), cache_state=d["cache_state"], cache_note=d["cache_note"])


def cache_dir():
    """The kernel cache directory: ``$FUSER_CACHE_DIR``, else ``$XDG_CACHE_HOME/fuser``, else
    ``~/.cache/fuser``. Entries live under its ``v1/``; deleting the directory is always safe.

    Example:
        >>> from fuser import jit
        >>> isinstance(jit.cache_dir(), str)
        True
    """
    return _C.cache_dir()

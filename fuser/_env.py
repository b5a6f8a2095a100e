"""fuser.env(): what fuser found on this machine (driver, GPU, NVRTC, cache) and whether the fused
path is available, or exactly why not."""
from __future__ import annotations

import dataclasses
import importlib.util
import os

import torch

from fuser import _C

__version__ = "0.1.0"   # the package's version (pyproject.toml says the same)

# Where the nvidia-cuda-nvrtc wheel (which CUDA builds of torch install) keeps libnvrtc, relative to
# the `nvidia` namespace package: CUDA 13 wheels use cu13/lib, CUDA 12 wheels cuda_nvrtc/lib.
_NVRTC_WHEEL_DIRS = ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib")


def nvrtc_wheel_dirs():
    """Library folders of installed nvidia-cuda-nvrtc wheels, in search order."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec else []
    dirs = []
    for root in roots:
        for rel in _NVRTC_WHEEL_DIRS:
            d = os.path.join(root, rel)
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


@dataclasses.dataclass(frozen=True)
class Env:
    """What ``fuser.env()`` found. ``fused_available`` is False with ``why`` saying exactly why.
    ``cache_note`` is empty when the disk kernel cache at ``cache_dir`` is in use, else why it is not
    (turned off, a directory fuser refuses, a path too long; ``cache_dir`` is then empty)."""

    fused_available: bool
    why: str
    driver_found: bool
    driver_path: str
    driver_version: str
    device: int
    device_count: int
    gpu_name: str
    compute_capability: tuple
    sm_count: int
    smem_per_block_optin: int
    l2_bytes: int
    nvrtc_found: bool
    nvrtc_path: str
    nvrtc_version: str
    cache_dir: str
    torch_version: str
    fuser_version: str
    cache_note: str = ""

    def as_dict(self):
        return dataclasses.asdict(self)

    def __str__(self):
        cc = "sm_%d%d" % self.compute_capability if self.compute_capability != (0, 0) else "-"
        rows = [
            ("fused path", "available" if self.fused_available else "unavailable: " + self.why),
            ("GPU", f"{self.gpu_name} ({cc}, {self.sm_count} SMs, {self.smem_per_block_optin} B smem/block, "
                    f"{self.l2_bytes >> 20} MiB L2)" if self.gpu_name else "none"),
            ("CUDA driver", f"{self.driver_version} at {self.driver_path}" if self.driver_found else "not found"),
            ("NVRTC", f"{self.nvrtc_version} at {self.nvrtc_path}" if self.nvrtc_found else "not found"),
            ("kernel cache", f"{self.cache_dir or '-'}: off ({self.cache_note})" if self.cache_note
             else self.cache_dir),
            ("torch", self.torch_version),
            ("fuser", self.fuser_version),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)} : {v}" for k, v in rows)


def _default_device():
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def _cache_note():
    """Why the disk kernel cache is not in use ("" when it is); asks the C core, changes nothing."""
    try:
        if _C.parse_flag("FUSER_CACHE_DISABLE", os.environ.get("FUSER_CACHE_DISABLE")):
            return "disabled by $FUSER_CACHE_DISABLE"
        _C.cache_root()
    except (ValueError, _C.CacheError) as e:
        return str(e)
    return ""


def env(device=None):
    """Describe what fuser found, loading the CUDA driver and NVRTC on first use.

    Args:
        device: CUDA device ordinal; defaults to torch's current device (0 without CUDA).

    Example:
        >>> import fuser
        >>> e = fuser.env()
        >>> e.fused_available or bool(e.why)
        True
    """
    d = _C.env(device=_default_device() if device is None else int(device), nvrtc_dirs=nvrtc_wheel_dirs())
    dv = d["driver_version"]
    return Env(
        fused_available=d["fused_available"], why=d["why"], driver_found=d["driver_found"],
        driver_path=d["driver_path"], driver_version=f"{dv // 1000}.{dv % 1000 // 10}" if dv else "",
        device=d["device"], device_count=d["device_count"], gpu_name=d["gpu_name"],
        compute_capability=tuple(d["compute_capability"]), sm_count=d["sm_count"],
        smem_per_block_optin=d["smem_per_block_optin"], l2_bytes=d["l2_bytes"], nvrtc_found=d["nvrtc_found"],
        nvrtc_path=d["nvrtc_path"],
        nvrtc_version="%d.%d" % tuple(d["nvrtc_version"]) if d["nvrtc_found"] else "",
        cache_dir=d["cache_dir"], torch_version=torch.__version__, fuser_version=__version__,
        cache_note=_cache_note(),
    )

"""Per-GPU measurement files under the kernel cache directory: what ``python -m fuser calibrate``
measured (``calibration/``) and the plans ``fuser.tune`` chose (``tuned/``). One JSON file per GPU model
(name and SM count), written atomically; a missing or unreadable file reads as empty (it is a cache:
deleting it is always safe, and a corrupt one is reported once and ignored, never trusted). A cache
directory fuser refuses (``jit.usable_cache_dir``) is neither read nor written; files are opened
without following a link or blocking, and only regular files are read."""
from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import warnings

from fuser import jit
from fuser._C import CacheError

_warned = set()


def device_key(gpu_name, sm_count):
    """The file name stem for one GPU model, e.g. ``NVIDIA-H200-132sm``.

    Example:
        >>> from fuser.store import device_key
        >>> device_key("NVIDIA H200", 132)
        'NVIDIA-H200-132sm'
    """
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", gpu_name).strip("-") + f"-{int(sm_count)}sm"


def path(kind, key, create=False):
    """The file of `kind`/`key` in the kernel cache directory; CacheError when fuser must not use it."""
    return os.path.join(jit.usable_cache_dir(create=create), kind, key + ".json")


def _read(p):
    """The text of the regular file at p: a link is refused and a FIFO does not block (OSError)."""
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{p} is not a regular file")
        os.set_blocking(fd, True)
        return f.read()


def load(kind, key):
    """The stored dict (``{}`` when absent or unreadable, or when the cache directory is refused)."""
    try:
        p = path(kind, key)
    except CacheError:  # jit warned once already
        return {}
    try:
        data = json.loads(_read(p))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        if p not in _warned:
            _warned.add(p)
            warnings.warn(f"fuser: ignoring {p} ({e}); delete it or run the command that writes it again",
                          RuntimeWarning, stacklevel=2)
        return {}


def save(kind, key, data):
    """Write `data` (a JSON-able dict) atomically; returns the path. CacheError when the cache directory
    is refused."""
    p = path(kind, key, create=True)
    os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p), prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p

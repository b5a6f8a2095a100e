"""Per-GPU measurement files under the kernel cache directory: what ``python -m fuser calibrate``
measured (``calibration/``) and the plans ``fuser.tune`` chose (``tuned/``). One JSON file per GPU model
(name and SM count), written atomically; a missing or unreadable file reads as empty (it is a cache:
deleting it is always safe, and a corrupt one is reported once and ignored, never trusted)."""
from __future__ import annotations

import json
import os
import re
import tempfile
import warnings

from fuser import jit

_warned = set()


def device_key(gpu_name, sm_count):
    """The file name stem for one GPU model, e.g. ``NVIDIA-H200-132sm``.

    Example:
        >>> from fuser.store import device_key
        >>> device_key("NVIDIA H200", 132)
        'NVIDIA-H200-132sm'
    """
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", gpu_name).strip("-") + f"-{int(sm_count)}sm"


def path(kind, key):
    return os.path.join(jit.cache_dir(), kind, key + ".json")


def load(kind, key):
    """The stored dict (``{}`` when absent or unreadable)."""
    p = path(kind, key)
    try:
        with open(p) as f:
            data = json.load(f)
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
    """Write `data` (a JSON-able dict) atomically; returns the path."""
    p = path(kind, key)
    os.makedirs(os.path.dirname(p), exist_ok=True)
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

"""Make a torchvision built for another torch importable, so that transformers (and timm) import: what
``python -m fuser demo``, ``explain`` and ``warmup`` do before building their LLaMA, and the tests before
building their models.

Why: transformers imports torchvision whenever it is installed beside Pillow (its image utilities, reached
even from ``LlamaConfig``), and timm imports it always. On PyPI the Linux torchvision wheels are CUDA
builds: beside a CPU build of torch (what ``.ci/run`` installs, and what the README suggests for CPU-only
machines) their compiled ops cannot load (``libc10_cuda.so`` is missing), and torchvision's import then
dies registering fake kernels for the ops ``torchvision::nms``/``qnms``, which do not exist.

What this does: only when importing torchvision fails with exactly that error, it declares the schemas of
those two ops (no kernels), then imports torchvision again. torchvision's Python parts (all that
transformers and timm use here) then work; calling its compiled ops would still fail loudly. Where
torchvision imports normally, or is not installed, it does nothing.
"""
from __future__ import annotations

import sys

__all__ = ["importable_torchvision"]

_LIB = None   # the torch.library fragment holding the declared schemas (kept alive with the process)


def importable_torchvision():
    """Import torchvision, declaring its missing op schemas first if that is what breaks it.

    Returns the torchvision module, or None if torchvision is not installed.

    Example:
        >>> from fuser.tools.compat import importable_torchvision
        >>> tv = importable_torchvision()
        >>> tv is None or hasattr(tv, "ops")
        True
    """
    global _LIB
    try:
        import torchvision
        return torchvision
    except ImportError:
        return None
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    import torch
    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass   # already declared
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    import torchvision
    return torchvision

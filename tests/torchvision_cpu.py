"""Make a CUDA-built torchvision importable beside a CPU build of torch (CI's setup), so that timm and
transformers import.

Why: timm imports ``torchvision`` at import time (``timm.layers`` needs ``torchvision.ops.misc``), and
transformers fails to import models when torchvision is installed but broken. On PyPI the Linux
torchvision wheels are CUDA builds: beside CI's CPU torch 2.13.0 their compiled ops cannot load
(``libc10_cuda.so`` is missing), and torchvision's import then dies registering fake kernels for the
ops ``torchvision::nms``/``qnms``, which do not exist. The alternative, a CUDA torch + torchvision pair
(torch 2.14.1 + torchvision 0.29.1), is a 5.5 GB install for CI.

What this does: only when importing torchvision fails with exactly that error, it declares the schemas
of those two ops (no kernels), then imports torchvision again. torchvision's Python parts (all that timm
and transformers use here) then work; calling its compiled ops would still fail loudly. Where
torchvision imports normally (the GPU machine), it does nothing.
"""
import sys

_LIB = None


def make_importable():
    """Import torchvision, declaring its missing op schemas first if that is what breaks it.

    Returns the torchvision module, or None if torchvision is not installed.

    Example:
        >>> make_importable() is None or hasattr(make_importable(), "ops")
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

"""fuser: fused transformer FFNs (GEMM -> activation or gate -> GEMM) in one kernel on NVIDIA Hopper.

The intermediate activation stays on chip, spread over the distributed shared memory of a
thread-block cluster (the FlashFuser dataflows). A C core plans, generates and JIT-compiles the
kernel; this package is the PyTorch face of it.

    >>> import torch, fuser
    >>> x = torch.randn(3, 64)
    >>> y = fuser.ffn(x, torch.randn(256, 64), torch.randn(64, 256), activation="gelu")
    >>> y.shape
    torch.Size([3, 64])

``fuser.optimize(model)`` swaps the FFNs of a PyTorch model for ``FusedFFN`` modules (which call the
operator ``torch.ops.fuser.ffn``); ``fuser.report(model)`` lists what was fused and what was skipped,
and why; ``fuser.warmup(model)`` compiles its fused kernels ahead of time. ``torch.compile(model,
backend="fuser")`` fuses FFNs in the compiled graph instead. A ``fuser.Plan`` explains itself
(``plan.explain()``) and draws itself (``plan.to_svg()``, shown by notebooks).
``fuser.env()`` says what was found on this machine and, when the fused path is unavailable, why.
``fuser.fp8`` quantizes an FFN to e4m3 (W8A8, static activation scales) for ``fuser.ffn(..., scales=)``;
``fuser.quantize(model, *samples)`` runs a model's FFNs that way, calibrated on one forward of samples.
"""
import importlib

from fuser._C import CacheError, CompileError, CudaError, FuserError, UnsupportedError
from fuser._env import Env, __version__, env  # noqa: F401
from fuser import fp8, jit
from fuser.planner import DATAFLOWS, Plan, plan, plans, simulate
from fuser.reference import ACTIVATIONS, ffn_reference
from fuser.runtime import Kernel, compile
from fuser.ops import ffn
from fuser import custom_op  # noqa: F401  (registers torch.ops.fuser.ffn)
from fuser.module import FusedFFN
from fuser.optimize import Report, optimize, quantize, report, revert

__all__ = [
    "ffn", "ffn_reference", "env", "Env", "ACTIVATIONS", "plan", "plans", "Plan", "simulate", "DATAFLOWS", "jit", "compile", "Kernel",
    "fp8",
    "optimize", "quantize", "report", "revert", "Report", "FusedFFN", "warmup", "tune",
    "FuserError", "CudaError", "CompileError", "CacheError", "UnsupportedError",
]

#: What the package offers from fuser.tools (name -> (module, attribute; None for the module itself)),
#: imported on first use: ``import fuser`` does not load the tools.
_TOOLS = {"warmup": ("fuser.tools.warm", "warmup"), "tune": ("fuser.tools.tuning", "tune"),
          "bench": ("fuser.tools.bench", None), "calibrate": ("fuser.tools.calibrate", None),
          "probes": ("fuser.tools.probes", None), "tuning": ("fuser.tools.tuning", None),
          "warm": ("fuser.tools.warm", None)}


def __getattr__(name):
    if name not in _TOOLS:
        raise AttributeError(f"module 'fuser' has no attribute {name!r}")
    module, attr = _TOOLS[name]
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)

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
"""
__version__ = "0.1.0"

from fuser._C import CacheError, CompileError, CudaError, FuserError, UnsupportedError
from fuser import jit
from fuser._env import Env, env
from fuser.ops import ffn
from fuser.runtime import Kernel, compile
from fuser.planner import DATAFLOWS, Plan, plan, plans, simulate
from fuser.reference import ACTIVATIONS, ffn_reference
from fuser import custom_op  # noqa: E402,F401  (registers torch.ops.fuser.ffn)
from fuser.module import FusedFFN
from fuser.optimize import Report, optimize, report, revert
from fuser.warm import warmup
from fuser.tuning import tune
from fuser import bench, calibrate, svg, tuning, warm  # noqa: E402,F811  (fuser.svg.plan_svg, fuser.bench.run, ...)

__all__ = [
    "ffn", "ffn_reference", "env", "Env", "ACTIVATIONS", "plan", "plans", "Plan", "simulate", "DATAFLOWS", "jit", "compile", "Kernel",
    "optimize", "report", "revert", "Report", "FusedFFN", "warmup", "tune",
    "FuserError", "CudaError", "CompileError", "CacheError", "UnsupportedError",
]

"""Running fused plans: ``fuser.compile`` (plan -> CUBIN through NVRTC and the disk cache, no GPU
needed), loading onto a device, the per-stream scratch buffer (inter-cluster workspace and its tickets),
the plan cache (consulting ``fuser.tune``'s stored winners first), and the fused branch of
``fuser.ffn``. Nothing here synchronises the device."""
from __future__ import annotations

import collections
import dataclasses
import threading

import torch

from fuser import _C
from fuser.target import default_target, tuned_plan

_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A plan compiled for sm_90a: the generated ``source`` and its :class:`fuser.jit.Compiled` module
    (``compiled.cubin``, ``.log``, ``.registers``, ``.spill_bytes``, ``.key``). ``shared_bytes`` is
    what a launch asks for: the plan's dynamic shared memory plus any static."""

    plan: object
    source: str
    compiled: object

    cubin = property(lambda self: self.compiled.cubin)
    log = property(lambda self: self.compiled.log)
    registers = property(lambda self: self.compiled.registers)
    spill_bytes = property(lambda self: self.compiled.spill_bytes)
    cache_hit = property(lambda self: self.compiled.cache_hit)
    key = property(lambda self: self.compiled.key)

    @property
    def shared_bytes(self):
        return self.plan.derived["smem_bytes"] + self.compiled.shared_bytes


# Markers of CUDA math library slow-path subroutines in a CUBIN (their labels are kept in the ELF).
_MATH_SUBROUTINES = (b"_slowpath", b"__cuda_sm3x_", b"__cuda_sm20_")


def compile(plan):  # noqa: A001 - the public name the issue asks for
    """Compile a fused plan to a CUBIN for sm_90a (NVRTC, through the on-disk cache). Needs NVRTC, not a GPU.

    Example:
        >>> import fuser
        >>> p = fuser.plan(64, 768, 3072, activation="gelu", fused=True, target="h200")
        >>> k = fuser.compile(p)  # doctest: +SKIP
        >>> k.spill_bytes  # doctest: +SKIP
        0
    """
    from fuser.planner import Plan
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    if not plan.fused:
        raise ValueError("plan: an unfused plan runs PyTorch ops; there is nothing to compile")
    from fuser.jit import compile_source
    source = _C.codegen(plan._d, plan.target or "h200")
    compiled = compile_source(source, "fuser_ffn.cu")
    if any(tag in compiled.cubin for tag in _MATH_SUBROUTINES):
        # see include/fuser/device/common.cuh: such calls clobbered live registers on an H200
        from fuser import CompileError
        raise CompileError("fuser: the generated kernel calls a CUDA math slow-path subroutine "
                           "(IEEE division or similar), which fuser does not run; this is a bug in "
                           "fuser's kernel templates, please report it with the plan: " + plan.summary())
    return Kernel(plan=plan, source=source, compiled=compiled)


# ---- loaded kernels, scratch, plans: process-wide caches ----

_loaded = {}                       # (cache key, device) -> kernel capsule
_scratch = {}                      # (device, stream) -> _Scratch
_captured = []                     # scratch that CUDA graphs reference: kept for the process's life
_plans = collections.OrderedDict()  # chain key -> Plan (LRU)
_PLAN_CACHE_SIZE = 4096
_env_ok = {}                       # device -> (fused available, why)


def load(kernel, device):
    """Load a compiled kernel onto CUDA device `device` (once per process)."""
    key = (kernel.key, device)
    with _lock:
        k = _loaded.get(key)
    if k is None:
        with torch.cuda.device(device):
            torch.cuda.current_stream()  # torch's context is current on this thread
            k = _C.load_kernel(kernel.plan._d, kernel.plan.target or "h200", kernel.cubin, device)
        with _lock:
            k = _loaded.setdefault(key, k)
    return k


class _Scratch:
    """Zeroed tickets + inter-cluster workspace for one (device, stream), from the driver's
    stream-ordered allocator: outside torch's allocator, so CUDA-graph pools (cudagraph trees
    included) never see it. Freed on its stream when replaced or collected."""

    __slots__ = ("capsule", "tickets", "floats")

    def __init__(self, device, stream, tickets, ws_floats):
        self.capsule = _C.scratch_alloc(device, tickets, ws_floats, stream)
        self.tickets, self.floats = tickets, tickets + ws_floats

    def fits(self, tickets, ws_floats):
        return self.tickets >= tickets and self.floats >= self.tickets + ws_floats


class _Launch:
    """What launching a fused plan on one device needs, worked out once (kept on the Plan): the loaded
    kernel, and the scratch per block row of tokens (one ticket per share tile and fp32 partials of
    every d_ff cluster, both only with an inter-cluster reduction)."""

    __slots__ = ("kernel", "rows", "tickets_per_row", "floats_per_row")

    def __init__(self, plan, device):
        self.kernel = load(kernel_for(plan), device)
        d, cls, bm = plan.derived, plan.cluster, plan.tiles["bm"]
        self.rows = cls[0] * bm
        multi = d["grid_n"] > 1
        self.tickets_per_row = cls[0] * cls[3] * d["lc"] * d["cls_reduce"] if multi else 0
        self.floats_per_row = d["grid_n"] * cls[0] * bm * d["l_pad"] if multi else 0

    def need(self, m):
        """(zeroed tickets, workspace floats) of a launch with `m` tokens."""
        grid_m = -(-m // self.rows)
        return grid_m * self.tickets_per_row, grid_m * self.floats_per_row


def _launch_of(plan, device):
    launches = plan.__dict__.get("_launch")
    if launches is None:
        launches = plan.__dict__.setdefault("_launch", {})
    l = launches.get(device)
    if l is None:
        l = launches.setdefault(device, _Launch(plan, device))
    return l


def _scratch_for(plan, m, device, stream):
    """The scratch for a launch of `plan` with `m` tokens on (device, stream)."""
    return _scratch_fitting(*_launch_of(plan, device).need(m), device, stream)


def _scratch_fitting(tickets, ws, device, stream):
    key = (device, stream)
    buf = _scratch.get(key)
    if buf is not None and buf.fits(tickets, ws):
        return buf
    if torch.cuda.is_current_stream_capturing():
        # capture runs on its own stream: reuse what the warm-up allocated on this device (nothing may be
        # allocated or zeroed while capturing)
        fits = [b for (dev, _), b in _scratch.items() if dev == device and b.fits(tickets, ws)]
        if fits:
            buf = _scratch[key] = max(fits, key=lambda b: b.floats)
            _captured.append(buf)  # a graph now holds its address: never free it
            return buf
        raise RuntimeError("fuser: this call needs a larger workspace than was allocated before CUDA graph "
                           "capture; run the model once with the same shapes before capturing")
    cap = max(tickets, 4096, buf.tickets if buf else 0)
    need_ws = max(ws, buf.floats - buf.tickets if buf else 0)
    buf = _scratch[key] = _Scratch(device, stream, cap, need_ws)
    return buf


_gpu = {}                          # device -> (GPU name, SM count)


def fused_available(device):
    """(True, "") when fused kernels can run on CUDA device `device`, else (False, why)."""
    r = _env_ok.get(device)
    if r is None:
        from fuser._env import env
        e = env(device)
        _gpu[device] = (e.gpu_name, e.sm_count)
        r = _env_ok[device] = (e.fused_available, e.why)
    return r


def forget_plans():
    """Drop the plans cached in this process (after a calibration or tuning changed what is best)."""
    with _lock:
        _plans.clear()


def tuned(chain, gpu_name, sm_count):
    """The :class:`fuser.Plan` ``fuser.tune`` stored for this exact chain on this GPU model, or None.

    Example:
        >>> import fuser
        >>> from fuser.runtime import tuned
        >>> tuned(fuser.plan(16, 768, 3072).chain, "a GPU never tuned", 1) is None
        True
    """
    from fuser.planner import Plan
    d = tuned_plan(chain, gpu_name, sm_count)
    if d is None:
        return None
    try:
        return Plan.from_dict(d)
    except (TypeError, ValueError):
        return None    # a plan the core no longer accepts (e.g. limits changed): plan again


def plan_for(chain, device):
    """The cached plan for a chain (from fuser.ffn's validation) on a device: the one ``fuser.tune``
    stored for it on this GPU model, else the planner's choice."""
    key = (chain["m"], chain["d_model"], chain["d_ff"], chain["d_out"], chain["gated"], chain["activation"],
           chain["bias_up"], chain["bias_gate"], chain["bias_down"], chain["dtype"], device)
    with _lock:
        p = _plans.get(key)
        if p is not None:
            _plans.move_to_end(key)
            return p
    from fuser.planner import Plan
    fused_available(device)
    p = tuned(chain, *_gpu[device]) if _gpu.get(device, ("",))[0] else None
    if p is None:
        with torch.cuda.device(device):
            target = default_target()
        raw, stats = _C.search({k: chain[k] for k in ("m", "d_model", "d_ff", "d_out", "gated", "activation",
                                                      "bias_up", "bias_gate", "bias_down", "dtype")}, target, k=1)
        p = Plan(raw[0], stats)
    with _lock:
        _plans[key] = p
        while len(_plans) > _PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return p


_compiled = {}  # plan params + chain (without m) -> Kernel


def kernel_for(plan):
    """The compiled kernel of a fused plan (compiled once per process; the disk cache spans processes)."""
    key = plan.__dict__.get("_kernel_key")
    if key is None:  # the generated source is the key: made once per Plan object (~6 us)
        key = plan.__dict__["_kernel_key"] = _C.codegen(plan._d, plan.target or "h200")
    k = _compiled.get(key)
    if k is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fuser: a new kernel would be compiled during CUDA graph capture; run the model "
                               "once with the same shapes before capturing")
        k = _compiled.setdefault(key, compile(plan))
    return k


def run(plan, tensors, activation, device, m, stream):
    """Launch a fused plan with `m` tokens on CUDA stream `stream` (the caller's current one) of `device`.

    `tensors` are (x, w_up, w_down, w_gate, b_up, b_gate, b_down, y) as fuser.ffn exports them (DLPack
    capsules or objects with __dlpack__, None where absent), validated by the caller; y is written in
    place."""
    l = _launch_of(plan, device)
    tickets, ws = l.need(m)
    buf = _scratch.get((device, stream))
    if buf is None or not buf.fits(tickets, ws):
        buf = _scratch_fitting(tickets, ws, device, stream)
    _C.ffn_launch(l.kernel, *tensors[:7], activation, tensors[7], buf.capsule, stream)

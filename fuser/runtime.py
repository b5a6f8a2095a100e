"""Fused plans on a GPU: ``fuser.compile`` (plan -> CUBIN through NVRTC and the disk cache, no GPU
needed), kernels loaded per device, the scratch that launches on one stream share, the plan a chain
runs (a ``fuser.tune`` winner first, else the planner's choice, cached), and ``Launch``: one fused plan
loaded on one device, the only caller of ``_C.ffn_launch``. Every ``_C`` call that loads or launches a
kernel is in this file, but for the eager route's gate kernel, which C loads and launches by itself from
the eager ops (``_C.eager``) with the CUBIN and torch's predicates registered here (``gate_cubin``).
Nothing here synchronises the device.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import statistics
import threading
import time
import warnings

import torch

from fuser import _C, interop, jit, planner
from fuser._C import CompileError, FuserError
from fuser._env import env
from fuser.reference import ACTIVATIONS
from fuser.target import default_target, tuned_plan

__all__ = ["Kernel", "compile", "MATH_SUBROUTINES", "Launch", "launch_for", "fused_available", "plan_for", "tuned",
           "forget_plans", "host_op_us", "eager_ops", "host_bound", "host_bound_plan", "host_bound_fused",
           "GATE_ACTS", "gate_compile", "gate_cubin", "register_eager_hooks"]

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


#: Markers of CUDA math library slow-path subroutines in a CUBIN (their labels are kept in the ELF).
MATH_SUBROUTINES = (b"_slowpath", b"__cuda_sm3x_", b"__cuda_sm20_")


def compile(plan):  # noqa: A001 - fuser.compile
    """Compile a fused plan to a CUBIN for sm_90a (NVRTC, through the on-disk cache). Needs NVRTC, not a GPU.

    Example:
        >>> import fuser
        >>> p = fuser.plan(64, 768, 3072, activation="gelu", fused=True, target="h200")
        >>> k = fuser.compile(p)  # doctest: +SKIP
        >>> k.spill_bytes  # doctest: +SKIP
        0
    """
    if not isinstance(plan, planner.Plan):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    if not plan.fused:
        raise ValueError("plan: an unfused plan runs PyTorch ops; there is nothing to compile")
    source = _source(plan)
    compiled = jit.compile_source(source, "fuser_ffn.cu")
    if any(tag in compiled.cubin for tag in MATH_SUBROUTINES):
        # see include/fuser/device/common.cuh: such calls clobbered live registers on an H200
        raise CompileError("fuser: the generated kernel calls a CUDA math slow-path subroutine "
                           "(IEEE division or similar), which fuser does not run; this is a bug in "
                           "fuser's kernel templates, please report it with the plan: " + plan.summary())
    return Kernel(plan=plan, source=source, compiled=compiled)


# ---- process-wide caches ----------------------------------------------------------------------------

_compiled = {}                     # generated source -> Kernel
_loaded = {}                       # (cache key, device) -> kernel capsule
_scratch = {}                      # (device, stream) -> Scratch
_captured = []                     # scratch that CUDA graphs reference: kept for the process's life
_plans = collections.OrderedDict()  # chain values + device -> Plan (LRU)
_PLAN_CACHE_SIZE = 4096
_envs = {}                         # device -> fuser.env(device)


def _source(plan):
    """The generated CUDA source of a fused plan, made once per Plan object (~6 us); it also keys the
    kernel table."""
    source = plan.__dict__.get("_source")
    if source is None:
        source = plan.__dict__["_source"] = _C.codegen(plan.core, plan.target or "h200")
    return source


def has_kernel(plan):
    """Whether this process has compiled (or read from the disk cache) the kernel of fused `plan`."""
    return _source(plan) in _compiled


def kernel_for(plan):
    """The compiled kernel of a fused plan (compiled once per process; the disk cache spans processes)."""
    key = _source(plan)
    k = _compiled.get(key)
    if k is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fuser: a new kernel would be compiled during CUDA graph capture; run the model "
                               "once with the same shapes before capturing")
        k = _compiled.setdefault(key, compile(plan))
    return k


def load_module(kernel, device):
    """Load a compiled kernel onto CUDA device `device` now (no cache: ``load`` keeps what it loads)."""
    with torch.cuda.device(device):
        torch.cuda.current_stream()  # torch's context is current on this thread
        return _C.load_kernel(kernel.plan.core, kernel.plan.target or "h200", kernel.cubin, device)


def load(kernel, device):
    """Load a compiled kernel onto CUDA device `device` (once per process)."""
    key = (kernel.key, device)
    with _lock:
        k = _loaded.get(key)
    if k is None:
        k = load_module(kernel, device)
        with _lock:
            k = _loaded.setdefault(key, k)
    return k


class Scratch:
    """Zeroed tickets + inter-cluster workspace for one (device, stream), from the driver's
    stream-ordered allocator: outside torch's allocator, so CUDA-graph pools (cudagraph trees
    included) never see it. Freed on its stream when replaced or collected."""

    __slots__ = ("capsule", "tickets", "floats")

    def __init__(self, device, stream, tickets, ws_floats):
        self.capsule = _C.scratch_alloc(device, tickets, ws_floats, stream)
        self.tickets, self.floats = tickets, tickets + ws_floats

    def fits(self, tickets, ws_floats):
        return self.tickets >= tickets and self.floats >= self.tickets + ws_floats


def scratch(device, stream, tickets=0, ws_floats=0):
    """The scratch launches on (device, stream) share, holding at least `tickets` tickets and `ws_floats`
    workspace floats: the kept one, or a larger one that replaces it. During CUDA graph capture nothing
    may be allocated: the largest one already kept on the device is reused (and kept for good, since a
    graph now holds its address)."""
    key = (device, stream)
    buf = _scratch.get(key)
    if buf is not None and buf.fits(tickets, ws_floats):
        return buf
    if torch.cuda.is_current_stream_capturing():
        fits = [b for (dev, _), b in _scratch.items() if dev == device and b.fits(tickets, ws_floats)]
        if fits:
            buf = _scratch[key] = max(fits, key=lambda b: b.floats)
            _captured.append(buf)
            return buf
        raise RuntimeError("fuser: this call needs a larger workspace than was allocated before CUDA graph "
                           "capture; run the model once with the same shapes before capturing")
    cap = -(-max(tickets, 4096, buf.tickets if buf else 0) // 32) * 32  # keeps the workspace 128-byte aligned
    need_ws = max(ws_floats, buf.floats - buf.tickets if buf else 0)
    buf = _scratch[key] = Scratch(device, stream, cap, need_ws)
    return buf


def scratch_table():
    """The table of kept scratch, (device, stream) -> Scratch, to read only (its ``get`` is what a kept
    launch checks per call: one dict lookup with a key made once)."""
    return _scratch


class Launch:
    """One fused plan loaded on one CUDA device, ready to launch: the kernel, whose C side sizes the
    scratch of a launch (``_C.scratch_need``). Made once per (plan, device): ``launch_for``."""

    __slots__ = ("plan", "device", "kernel")

    def __init__(self, plan, device):
        self.plan, self.device = plan, device
        self.kernel = load(kernel_for(plan), device)

    def need(self, m):
        """(zeroed words, workspace floats) of a launch with `m` tokens."""
        return _C.scratch_need(self.kernel, m)

    def scratch(self, m, stream):
        """The scratch for a launch with `m` tokens on `stream`."""
        return scratch(self.device, stream, *self.need(m))

    def prepare(self, x, weights, activation, y, scratch, stream, borrow=0, keep=True, scales=None):
        """A launch validated and filled once (``_C.ffn_prepare``) for tensors like these on `stream`;
        ``_C.ffn_run(prepared, x_ptr, y_ptr[, six weight addresses])`` then launches it. With `keep` it
        holds the weights (their capsules must be borrowed: bits 1-6 of `borrow`); without, every run
        names the weights' addresses and it holds only the kernel and the scratch. A quantized chain's
        `scales` (x, up, gate, down, h) are read where prepared and held by the launch."""
        return _C.ffn_prepare(self.kernel, x, *weights, activation, y, scratch.capsule, stream, borrow, keep=keep,
                              scales=scales)

    def __call__(self, x, weights, activation, y, scratch, stream, borrow=0, scales=None):
        """Launch on `stream` (the caller's current one, on this device, which must be current). `x`,
        `y` and the six `weights` (w_up, w_down, w_gate, b_up, b_gate, b_down; None where absent) are
        DLPack capsules or objects with ``__dlpack__``; C validates them against the kernel's chain and
        consumes each capsule except those whose bit is set in `borrow` (bit 0 = x ... bit 7 = y). A
        quantized chain's `scales`: (x, up, gate, down, h) tensors."""
        _C.ffn_launch(self.kernel, x, *weights, activation, y, scratch.capsule, stream, borrow, scales=scales)


def launch_for(plan, device):
    """The ``Launch`` of fused `plan` on CUDA device `device` (kept on the plan).

    Example:
        >>> import fuser
        >>> from fuser import runtime
        >>> p = fuser.plan(16, 768, 3072, activation="gelu", fused=True)
        >>> runtime.launch_for(p, 0) is runtime.launch_for(p, 0)  # doctest: +SKIP
        True
    """
    launches = plan.__dict__.get("_launch")
    if launches is None:
        launches = plan.__dict__.setdefault("_launch", {})
    launch = launches.get(device)
    if launch is None:
        launch = launches.setdefault(device, Launch(plan, device))
    return launch


# ---- the plan a chain runs -----------------------------------------------------------------------------

def _env_of(device):
    e = _envs.get(device)
    if e is None:
        e = _envs[device] = env(device)
    return e


def fused_available(device):
    """(True, "") when fused kernels can run on CUDA device `device`, else (False, why).

    Example:
        >>> from fuser import runtime
        >>> ok, why = runtime.fused_available(0)
        >>> ok or why != ""
        True
    """
    e = _env_of(device)
    return e.fused_available, e.why


def tuned(chain, gpu_name, sm_count):
    """The :class:`fuser.Plan` ``fuser.tune`` stored for this exact chain on this GPU model, or None.

    Example:
        >>> import fuser
        >>> from fuser.runtime import tuned
        >>> tuned(fuser.plan(16, 768, 3072).chain, "a GPU never tuned", 1) is None
        True
    """
    d = tuned_plan(chain, gpu_name, sm_count)
    if d is None:
        return None
    try:
        return planner.Plan.from_dict(d)
    except (TypeError, ValueError):
        return None    # a plan the core no longer accepts (e.g. limits changed): plan again


def forget_plans():
    """Drop the plans cached in this process (``fuser.route.forget`` calls it, and drops the routes too).

    Example:
        >>> from fuser import runtime
        >>> runtime.forget_plans()
    """
    with _lock:
        _plans.clear()


def plan_for(chain, device):
    """The plan for a chain (as ``_C.ffn_check`` gives it) on CUDA device `device`: the one ``fuser.tune``
    stored for it on this GPU model, else the planner's choice; cached.

    Example:
        >>> import fuser
        >>> from fuser import runtime
        >>> chain = fuser.plan(16, 768, 3072).chain
        >>> runtime.plan_for(chain, 0).chain == chain  # doctest: +SKIP
        True
    """
    key = (*(chain[k] for k in planner.CHAIN_FIELDS), device)
    with _lock:
        p = _plans.get(key)
        if p is not None:
            _plans.move_to_end(key)
            return p
    e = _env_of(device)
    p = tuned(chain, e.gpu_name, e.sm_count) if e.gpu_name else None
    if p is None:
        with torch.cuda.device(device):
            tgt = default_target()
        p = planner.search(chain, tgt, k=1)[0]
    with _lock:
        _plans[key] = p
        while len(_plans) > _PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return p


# ---- outside CUDA graphs: host-bound calls ---------------------------------------------------------

#: The activations cuBLASLt computes in a GEMM's epilogue (``torch._addmm_activation``)
_EPILOGUE_ACTS = ("relu", "gelu_tanh")


def eager_ops(chain):
    """The launches fuser's eager route makes for `chain` on a CUDA device (python/eager_bind.c), each costing
    the host about one PyTorch op: a plain chain up, activation and down, or two where an up bias (or a zero bias
    in its place, from ``ZERO_BIAS_MIN_TOKENS`` tokens) and ReLU or tanh GELU put the activation in the up GEMM's
    epilogue; a gated 16-bit chain up, gate, the gate kernel
    (activation and product) and down (three where a module packed gate and up into one GEMM: not counted, the
    chain does not say); a quantized one PyTorch's five or three ops at least.

    Example:
        >>> from fuser import runtime
        >>> c = dict(gated=False, bias_up=True, activation="gelu_tanh", dtype="bfloat16")
        >>> runtime.eager_ops(c), runtime.eager_ops(dict(c, bias_up=False)), runtime.eager_ops(dict(c, gated=True))
        (2, 3, 4)
    """
    if chain["dtype"] == "float8_e4m3fn":
        return 5 if chain["gated"] else 3
    if chain["gated"]:
        return 4
    epilogue = chain["bias_up"] or 0 < ZERO_BIAS_MIN_TOKENS <= chain.get("m", 0)
    return 2 if epilogue and chain["activation"] in _EPILOGUE_ACTS else 3


#: A chain the planner runs eager is launched fused outside CUDA graphs only where its call is predicted at
#: least this much faster there (the host's time per op is measured, the rest is the model's) ...
HOST_BOUND_MARGIN = 1.25
#: ... and its kernel at most this much slower on the GPU than the eager ops (what a host running ahead of
#: the GPU, where the GPU's time is all that counts, would lose), or at most one PyTorch op's host time
#: slower (a loss no larger than what each launch the fused call saves gains on a host-bound call)
HOST_BOUND_GPU_CAP = 1.5
_host_op = {}                      # device -> us
#: Whether the current CUDA stream is capturing a graph (``torch.cuda.is_current_stream_capturing``, less a
#: Python frame; False in a build without CUDA, where torch._C's name is a dummy class that raises if called).
#: For the route and module code's per-call checks; not exported (torch's own function is the public one).
capturing = (torch._C._cuda_isCurrentStreamCapturing if torch.version.cuda is not None
             and hasattr(torch._C, "_cuda_isCurrentStreamCapturing") else lambda: False)


def host_op_us(device):
    """What one small PyTorch op costs this process's host outside CUDA graphs, in microseconds: the calling
    thread's CPU time per ``F.linear`` of tiny bfloat16 tensors on CUDA device `device` (the median of 7
    loops of 16 calls), measured once per device; None while the current stream captures a CUDA graph or a
    torch dispatch or function mode is active (nothing is launched then: it would be captured, or seen by
    the mode).

    Example:
        >>> from fuser import runtime
        >>> runtime.host_op_us(0) > 0  # doctest: +SKIP
        True
    """
    us = _host_op.get(device)
    if us is None:
        if capturing() or torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
            return None
        linear = torch.nn.functional.linear
        with torch.cuda.device(device):
            x = torch.zeros(8, 64, device=device, dtype=torch.bfloat16)
            w = torch.zeros(64, 64, device=device, dtype=torch.bfloat16)
            for _ in range(8):
                linear(x, w)
            loops = []
            for _ in range(7):
                t0 = time.thread_time()
                for _ in range(16):
                    linear(x, w)
                loops.append((time.thread_time() - t0) / 16 * 1e6)
        us = _host_op[device] = statistics.median(loops)
    return us


def host_bound(eager_us, fused_us, host_us, ops):
    """Whether a call outside CUDA graphs runs faster fused than eager, for the eager ops' predicted GPU
    time `eager_us` (what the planner compares in a graph), a fused plan's `fused_us`, `host_us` per
    PyTorch op launched and the eager route's `ops` launches (``eager_ops``). Outside graphs each op costs
    the host `host_us` while the GPU waits, so a call
    takes about the larger of its host and GPU times: the eager ops' ``max(eager_us, ops x host_us)``
    against one launch's ``max(fused_us, host_us)``, which must be ``HOST_BOUND_MARGIN`` times less, with
    ``fused_us`` at most ``HOST_BOUND_GPU_CAP`` times ``eager_us`` or at most ``eager_us + host_us``.

    Example:
        >>> from fuser import runtime
        >>> runtime.host_bound(7.4, 8.0, 20.0, 3), runtime.host_bound(1000.0, 1300.0, 20.0, 4)
        (True, False)
    """
    eager_call = max(eager_us, ops * host_us)
    fused_call = max(fused_us, host_us)
    cap = max(HOST_BOUND_GPU_CAP * eager_us, eager_us + host_us)
    return fused_us <= cap and fused_call * HOST_BOUND_MARGIN <= eager_call


def host_bound_plan(chain, device, graph_plan, host_us=None):
    """The fused plan to launch outside CUDA graphs for a chain whose plan in them (`graph_plan`, from
    ``plan_for``) is the eager ops, where ``host_bound`` says the call is faster fused there with this
    host's ``host_op_us`` (or `host_us`, when the caller has read it); else None (also while nothing can
    be timed: a graph being captured, a torch mode).

    Example:
        >>> import fuser
        >>> from fuser import runtime
        >>> chain = fuser.plan(128, 768, 3072).chain
        >>> runtime.host_bound_plan(chain, 0, runtime.plan_for(chain, 0))  # doctest: +SKIP
    """
    if graph_plan.fused:
        return None
    host = host_op_us(device) if host_us is None else host_us
    if host is None:
        return None
    with torch.cuda.device(device):
        tgt = default_target()
    return host_bound_fused(chain, tgt, graph_plan, host)


def host_bound_fused(chain, target, graph_plan, host_us):
    """``host_bound_plan``'s choice for a host whose PyTorch ops cost `host_us` each: the planner's best
    fused plan for `chain` on `target` (what ``fuser.plan(..., fused=True)`` gives, and ``fuser.warmup``
    compiles) where ``host_bound`` takes it over the eager `graph_plan`, else None (also where no fused
    plan fits the chain).

    Example:
        >>> import fuser
        >>> from fuser import planner, runtime
        >>> eager = fuser.plan(128, 768, 3072, target="h200")
        >>> eager.fused, runtime.host_bound_fused(eager.chain, planner.default_target(), eager, 20.0).fused
        (False, True)
    """
    try:
        fused = planner.search(chain, target, k=1, constraints={"fused": 1})[0]
    except ValueError:   # no fused plan fits (alignment, say)
        return None
    if not host_bound(graph_plan.predicted_us, fused.predicted_us, host_us, eager_ops(chain)):
        return None
    return fused


# ---- the eager route's gate kernel ---------------------------------------------------------------------

#: The order of the C core's activations (FUSER_ACT_*), in which ``_C.gate_setup`` takes their functions
GATE_ACTS = ("relu", "gelu", "gelu_tanh", "silu")


def _in_place_acts():
    """The activations' in-place forms in GATE_ACTS order (ATen's ``relu_``, ``gelu_``, ``silu_``: the same
    kernels as the out-of-place ops, so the same values), None where this torch has none."""
    gelu_ = getattr(torch._C._nn, "gelu_", None)
    forms = {"relu": getattr(torch, "relu_", None), "gelu": gelu_,
             "gelu_tanh": None if gelu_ is None else functools.partial(gelu_, approximate="tanh"),
             "silu": getattr(torch._C._nn, "silu_", None)}
    return tuple(forms[a] for a in GATE_ACTS)


def gate_compile():
    """The eager route's gate kernels (``_C.gate_source()``) compiled for sm_90a through the disk cache: a
    :class:`fuser.jit.Compiled` (needs NVRTC, or the cache entry, not a GPU; ``fuser.warmup`` calls it for models
    with gated FFNs, so that their first eager call does not compile).

    Example:
        >>> from fuser import runtime
        >>> runtime.gate_compile().spill_bytes  # doctest: +SKIP
        0
    """
    return jit.compile_source(_C.gate_source(), "fuser_gate.cu")


def gate_cubin(device):
    """The CUBIN of the eager route's gate kernels (``_C.gate_source()``, through the disk cache) for CUDA
    device `device`, or a str saying why there is none: C calls this the first time a gated eager route
    could run them on that device, and loads what it returns; the device then runs PyTorch's two ops
    (the activation, then the product) wherever the kernel is unavailable. A compile that fails warns once.

    Example:
        >>> from fuser import runtime
        >>> isinstance(runtime.gate_cubin(0), (bytes, str))  # doctest: +SKIP
        True
    """
    ok, why = fused_available(device)
    if not ok:
        return why
    try:
        return gate_compile().cubin
    except FuserError as e:   # a compile or cache error: the ops stay correct, say why once
        warnings.warn(f"fuser: the gate kernel is not available, gated eager routes run PyTorch's two ops: {e}",
                      RuntimeWarning, stacklevel=2)
        return f"{type(e).__name__}: {e}"


#: The fewest tokens at which a plain chain without an up bias whose activation is ReLU or tanh GELU takes it in
#: the up GEMM's cuBLASLt epilogue over a zero bias (``_C.zero_bias_setup``; 0: never, else at least 2, where torch
#: runs ``_addmm_activation`` through cuBLASLt). 2: from two rows it beat the ops in every cell
#: ``benchmarks/eager_epilogue.py --zero-bias`` times (docs/kernels.md, step 50 and "Next kernels" 12). The
#: planner prices the eager route by the C core's copy of this default (``_C.EAGER_EPILOGUE_TOKENS``).
ZERO_BIAS_MIN_TOKENS = _C.EAGER_EPILOGUE_TOKENS


def zero_bias(w):
    """A zero bias for weight `w`'s rows (its dtype and device), which C keeps per device, dtype and length for the
    process (``_C.zero_bias_setup``), or None while the current stream captures a CUDA graph (the tensor would
    live in the graph's memory pool; the call runs the ops). Copied from the host, so its zeros are in place on
    every stream when it returns.

    Example:
        >>> import torch
        >>> from fuser import runtime
        >>> runtime.zero_bias(torch.ones(3, 2, dtype=torch.bfloat16))
        tensor([0., 0., 0.], dtype=torch.bfloat16)
    """
    if capturing():
        return None
    return torch.zeros(w.shape[0], dtype=w.dtype).to(w.device)


def register_eager_hooks():
    """Register with C what the eager route's own steps need (``_C.gate_setup``): the gate kernel's loader, the
    activations, torch's predicates read at each call, ``torch._addmm_activation`` (None on a torch without
    it), the activations' in-place forms, the linear whose ``out=`` form writes the down projection into a
    caller's ``out``, and the zero biases' maker and token threshold (``zero_bias``, ``ZERO_BIAS_MIN_TOKENS``).
    Done at import.

    Example:
        >>> from fuser import runtime
        >>> runtime.register_eager_hooks()
    """
    _C.gate_setup(gate_cubin, tuple(ACTIVATIONS[a] for a in GATE_ACTS), capturing,
                  torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled,
                  interop.current_device, interop.raw_stream, interop.disabled, torch.is_grad_enabled,
                  getattr(torch, "_addmm_activation", None), _in_place_acts(), torch.nn.functional.linear)
    _C.zero_bias_setup(zero_bias, ZERO_BIAS_MIN_TOKENS)


register_eager_hooks()

"""One route per FFN shape: the fused launch of a plan, or the PyTorch eager ops.

The decision is made once per chain and device (``route_for``: CUDA, 16-bit, tokens, a fused path on
the device, and the plan the chain runs) and kept in a ``Route``, which ``fuser.ffn``, the operator
``fuser::ffn`` and ``FusedFFN`` all hold and run. What may change from one call to the next is checked
when a route runs: a fused route computes with the eager ops instead when autograd has to record the
call or ``FUSER_DISABLE`` is set, and launches on the caller's current stream.

The planner compares the eager ops and fused plans as a CUDA graph replays them. Outside graphs, where a
script or notebook calls its model, every PyTorch op also costs the host a launch (several microseconds)
while the GPU waits; where the planner runs a chain eager but a fused plan's one launch is predicted
faster there (``runtime.host_bound``, with the host's cost measured once per process), the chain gets a
``HostBoundRoute``: the fused launch outside graphs, the eager ops while a graph is captured.

``forget()`` (after ``fuser.tune`` or ``python -m fuser calibrate`` changed what is best) drops the
routes and plans cached here and marks the routes handed out ``stale``, so their holders decide again.
"""
from __future__ import annotations

import torch

from fuser import _C, fp8, interop, runtime
from fuser.planner import CHAIN_FIELDS
from fuser.reference import ACTIVATIONS

__all__ = ["Route", "FusedRoute", "HostBoundRoute", "route_for", "prepare_thread", "forget"]

_FUSED_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_export = interop.export
_raw_stream = interop.raw_stream
_current_device = interop.current_device
_scratch_get = runtime.scratch_table().get   # (device, stream) -> the scratch kept there
_ffn_run = getattr(_C, "ffn_run", None)
_eager = _C.eager
_linear = torch.nn.functional.linear
_capturing = runtime.capturing
_empty_like = torch.empty_like
_thread_prepared = _C.thread_prepared
_MAX_PREPARED = 64                 # prepared launches a route keeps (one per layer it serves, per stream)


class Route:
    """The eager route: the FFN in PyTorch ops (``fuser.reference.eager``'s, run from C by ``_C.eager``,
    where a gated chain's activation and product are one gate kernel wherever it applies, with the same
    result; a quantized chain's, with `scales`: ``fuser.fp8.eager``). Taken where the tensors are not on a
    CUDA device, not 16-bit (or e4m3), hold no tokens, where the device has no fused path, and where the
    planner's plan (``plan``; None where nothing was planned) is unfused."""

    fused = False
    graphs_eager = False   # True: the eager ops while a CUDA graph is captured, the plan's launch otherwise
    __slots__ = ("plan", "stale")

    def __init__(self, plan=None):
        self.plan, self.stale = plan, False

    def run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out=None, scales=None, pack=None):
        """The output for these (validated) tensors; written into `out` when given. `pack`: the gate and up
        weights as one tensor where they are (``fuser.module.packed_gate_up``), for one GEMM of both.

        Example:
            >>> import torch
            >>> from fuser.route import Route
            >>> x, w1, w2 = torch.randn(3, 8), torch.randn(16, 8), torch.randn(8, 16)
            >>> Route().run(x, w1, w2, None, None, None, None, "relu").shape
            torch.Size([3, 8])
        """
        if scales is not None:   # (x, up, gate, down, h): C's order
            s_x, s_up, s_gate, s_down, s_h = scales
            y = fp8.eager(x, w_up, w_down, fp8.Scales(x=s_x, up=s_up, down=s_down, h=s_h, gate=s_gate),
                          w_gate=w_gate, b_up=b_up, b_gate=b_gate, b_down=b_down, activation=activation)
        else:   # (with out: the down projection written there where C can, y is out then)
            y = _eager(_linear, ACTIVATIONS[activation], x, w_up, w_down, w_gate, b_up, b_gate, b_down,
                       *(() if pack is None else pack), *(() if out is None else (out,)))
        if out is None or y is out:
            return y
        if y.requires_grad:
            raise ValueError("out: out= does not support autograd (an input requires grad); "
                             "drop out= or run under torch.no_grad()")
        out.copy_(y)
        return out

    def __repr__(self):
        return f"<fuser route: {'eager ops' if self.plan is None else self.plan.summary()}>"


class FusedRoute(Route):
    """The fused route: ``plan`` launched on CUDA device ``device`` (``launch``, a ``runtime.Launch``).
    A call that needs autograd, or made while ``FUSER_DISABLE`` is set, runs the eager ops instead.

    Launches are prepared (``runtime.Launch.prepare``, validated and filled in C once) per stream,
    token count and weight addresses, holding no weights; a call then passes C only the weights'
    addresses, which key the preparation, and its other tensors, whose addresses C reads
    (``_C.ffn_run``). Its tensors were validated for this route's signature (``fuser.ops``), which fixes
    everything the preparation checked but the addresses. A call ``fuser.ffn`` or the operator serves from a
    kept route runs a launch already prepared in that same C call (``_C.ffn_kept``, reading ``fast``), exactly
    where ``run`` would launch it; ``run`` serves every other call."""

    fused = True
    __slots__ = ("device", "launch", "prepared", "same_shape", "fast")

    def __init__(self, plan, device):
        super().__init__(plan)
        self.device = device
        self.launch = runtime.launch_for(plan, device)
        self.prepared = {}   # (stream, tokens, w_up, w_down, w_gate addresses) -> (scratch, prepared launch)
        # y = empty_like(x), the cheapest allocation, where y has x's shape (and dtype: a quantized chain's x and y
        # are both bfloat16); x is row-major, as the route's checks require, so y is too
        c = plan.chain
        self.same_shape = c["d_out"] == c["d_model"]
        # what C reads to run a kept call's prepared launch itself (python/ffn_bind.c's fused_run: F_* fields)
        self.fast = (device, self.prepared, runtime.scratch_table(), self.same_shape, self.graphs_eager, _ffn_run,
                     _empty_like)

    def run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out=None, scales=None):
        if interop.disabled() or (_grad_enabled() and _any_requires_grad(x, w_up, w_down, w_gate, b_up, b_gate, b_down)):
            return Route.run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, scales)
        if out is not None:
            y = out
        elif self.same_shape:
            y = _empty_like(x)
        elif scales is not None:   # a quantized chain's output: bfloat16
            y = x.new_empty((*x.shape[:-1], w_down.shape[0]), dtype=torch.bfloat16)
        else:
            y = x.new_empty((*x.shape[:-1], w_down.shape[0]))
        if self.device == _current_device():
            self._launch(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, y, scales)
        else:
            with torch.cuda.device(self.device):   # preparing may allocate scratch, launching needs the context
                self._launch(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, y, scales)
        return y

    def _launch(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, y, scales=None):
        """Run the prepared launch for these tensors' stream, token count and weight addresses (and a
        quantized chain's scales, which a launch reads where prepared), prepared now if there is none, or
        if the stream's scratch was replaced."""
        device = self.device
        stream = _raw_stream(device)
        m = x.numel() // x.shape[-1]
        up, down, gate = w_up.data_ptr(), w_down.data_ptr(), None if w_gate is None else w_gate.data_ptr()
        key = (stream, m, up, down, gate) if scales is None else (
            stream, m, up, down, gate, *(None if t is None else t.data_ptr() for t in scales))
        e = self.prepared.get(key)
        if e is None or _scratch_get((device, stream)) is not e[0]:
            e = self._prepare(key, x, (w_up, w_down, w_gate, b_up, b_gate, b_down), activation, y, scales)
        # the other addresses C reads itself (torch's DLPack C exchange API: no data_ptr() calls here)
        _ffn_run(e[1], x, y, up, down, gate, b_up, b_gate, b_down)

    def _prepare(self, key, x, weights, activation, y, scales=None):
        stream, m = key[0], key[1]
        scratch = self.launch.scratch(m, stream)
        if len(self.prepared) >= _MAX_PREPARED:
            self.prepared.clear()
        # (a quantized chain's: constants to the kernel, taken as such even where one requires grad)
        kw = {} if scales is None else {"scales": tuple(None if t is None else t.detach() for t in scales)}
        e = self.prepared[key] = (scratch, self.launch.prepare(
            _export(x), tuple(None if t is None else _export(t) for t in weights), activation, _export(y), scratch,
            stream, keep=False, **kw))
        return e


class HostBoundRoute(FusedRoute):
    """A chain the planner runs eager in CUDA graphs (``graph_plan``), launched as the fused ``plan``
    outside them, where its one launch is predicted faster than the eager ops' launches
    (``runtime.host_bound``); while the caller's current stream captures a graph, the eager ops."""

    graphs_eager = True
    __slots__ = ("graph_plan",)

    def __init__(self, plan, device, graph_plan):
        super().__init__(plan, device)
        self.graph_plan = graph_plan

    def prepare(self, w_up):
        """Make ready, when the route is decided and outside any graph, what its graphs' eager ops take and a
        capture cannot make: the zero bias where the chain's activation goes into the up GEMM's epilogue over one
        (``runtime.eager_ops``), a gated chain's gate kernel, which loads at its first launch (``_C.gate`` on one
        row of zeros here), and the deciding thread's cuBLAS handles (``prepare_thread``). The calls outside
        graphs launch the fused kernel and make none of these, so without this a graph captured after them
        would fail, or run the activation and the product as two more kernels over a packed GEMM's strided halves."""
        c = self.graph_plan.chain
        prepare_thread(w_up)
        if not c["bias_up"] and runtime.eager_ops(c) == 2:
            _C.zero_bias(w_up)
        if c["gated"]:   # (a host-bound route is 16-bit; the gate declines at once off CUDA)
            g = torch.zeros(1, 8, dtype=w_up.dtype, device=w_up.device)
            _C.gate(g, torch.zeros_like(g), ACTIVATIONS[c["activation"]])

    def run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out=None, scales=None):
        if _capturing():
            return Route.run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, scales)
        if not _thread_prepared(self.device):
            prepare_thread(x)
        return FusedRoute.run(self, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, out, scales)

    def __repr__(self):
        return f"<fuser route: {self.plan.summary()} outside CUDA graphs, eager ops in them>"


def prepare_thread(t):
    """Make this thread's PyTorch cuBLAS and cuBLASLt handles on `t`'s CUDA device, as a host-bound route's
    graphs need them (one GEMM of two rows, without and with a bias: PyTorch makes each handle at its first GEMM
    on a thread, and a capture fails with CUBLAS_STATUS_NOT_INITIALIZED where it would make one; a single row
    takes no cuBLASLt), and record it (``_C.thread_prepared``), so that the C paths launch this thread's calls
    of host-bound routes from now on. Once per thread and device: the first call of a host-bound route on a
    thread comes here, since those paths leave it to ``HostBoundRoute.run``.

    Example:
        >>> import torch
        >>> from fuser.route import prepare_thread
        >>> prepare_thread(torch.zeros(3, 8, dtype=torch.bfloat16))   # (on the CPU: the GEMMs run, nothing is marked)
    """
    g = torch.zeros(2, 8, dtype=t.dtype, device=t.device)
    w = torch.zeros(8, 8, dtype=t.dtype, device=t.device)
    _linear(g, w)
    _linear(g, w, g[0])
    if t.device.type == "cuda":
        _thread_prepared(t.device.index, True)


_EAGER = Route()                   # for tensors that are never fused; never stale
_by_chain = {}                     # chain values + device -> Route
_MAX_ROUTES = 4096


def route_for(chain, plan=None):
    """The route of a validated chain (the dict ``_C.ffn_check`` returns: ``CHAIN_FIELDS`` and where the
    tensors are): decided once per chain and device and kept, or for an explicit `plan` (a
    :class:`fuser.Plan` for this chain) its fused launch where it can run, the eager ops elsewhere.

    Example:
        >>> import torch, fuser
        >>> from fuser import _C
        >>> from fuser.route import route_for
        >>> chain = _C.ffn_check(torch.randn(4, 8), torch.randn(16, 8), torch.randn(8, 16).bfloat16().float())
        >>> route_for(chain).fused
        False
    """
    if chain["device"] != "cuda" or chain["dtype"] not in _FUSED_DTYPES or chain["m"] == 0:
        return _EAGER
    device = chain["device_id"]
    if plan is not None:
        return FusedRoute(plan, device) if plan.fused and runtime.fused_available(device)[0] else _EAGER
    key = (*(chain[k] for k in CHAIN_FIELDS), device)
    r = _by_chain.get(key)
    if r is None:
        if not runtime.fused_available(device)[0]:
            r = Route()
        else:
            p = runtime.plan_for(chain, device)
            if p.fused:
                r = FusedRoute(p, device)
            elif chain["dtype"] == "float8_e4m3fn":   # (its eager route is not PyTorch's launches)
                r = Route(p)
            else:
                host = runtime.host_op_us(device)
                if host is None:
                    # nothing can be timed now (a graph being captured, a torch mode): this call runs the
                    # eager ops, and its holders decide again at the next call
                    r = Route(p)
                    r.stale = True
                    return r
                h = runtime.host_bound_plan(chain, device, p, host)
                r = HostBoundRoute(h, device, p) if h is not None else Route(p)
        if len(_by_chain) >= _MAX_ROUTES:
            forget_routes()
        r = _by_chain.setdefault(key, r)
    return r


def forget_routes():
    """Drop the routes cached here and mark them stale (their holders decide again on their next call)."""
    for r in list(_by_chain.values()):
        r.stale = True
    _by_chain.clear()


def forget():
    """Drop every route and plan this process keeps (after a calibration or a tuning changed what is
    best): the next call of each shape plans again.

    Example:
        >>> from fuser import route
        >>> route.forget()
    """
    forget_routes()
    runtime.forget_plans()

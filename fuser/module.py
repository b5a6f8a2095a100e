"""``FusedFFN``: the module ``fuser.optimize`` swaps in for an FFN, and ``FusedInto``, the pass-through
left where a sibling's down projection was fused away (BERT's ``output.dense``).

A ``FusedFFN`` adopts the children of the module it replaces under the same names, so it holds the
same ``Parameter`` objects (no copy) and its ``state_dict`` keys are the original ones: a checkpoint
saved before optimizing loads after, and the other way round. It reads its weights at every call
through the spec's ``WeightRef``s (a fused gate/up weight is sliced by rows: a contiguous, zero-copy
view), so ``model.to(...)``, ``load_state_dict`` and optimizers keep working on the originals; the
route kept for the last input shape checks at every call that the weights it holds are still those.

One layout change cannot be avoided: GPT-2's ``Conv1D`` stores its weight ``[in, out]``, and fuser
takes ``[out, in]`` row-major. The swap relays those Parameters out ONCE, in place (the same Parameter
objects, their data transposed into a new contiguous tensor; the old storage is freed), and the module
presents the original layout to the outside: ``state_dict()`` transposes those entries back (a copy per
call) and ``load_state_dict`` transposes what it loads. ``fuser.revert`` restores the original layout.
"""
from __future__ import annotations

import collections
import math
import warnings

import torch
from torch import nn

import fuser.custom_op  # noqa: F401  (registers torch.ops.fuser.ffn)
from fuser import _C, fp8, interop, ops, planner, runtime
from fuser.recognize import FFNSpec, NearMiss, Unsupported, recognise
from fuser.reference import ACTIVATIONS, eager
from fuser.structure import DROPOUTS

__all__ = ["FusedFFN", "FusedInto", "PLAN_TOKENS"]

_ROLES = ("up", "down", "gate", "b_up", "b_gate", "b_down")   # the order of ffn_launch's weights
#: The token count ``FusedFFN.plan_summary()`` (and so its repr and ``fuser.report``) plans for.
PLAN_TOKENS = 128

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing
_grad_enabled = torch.is_grad_enabled
_autocast = torch.is_autocast_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_to_capsule = interop.to_capsule
_raw_stream = interop.raw_stream
_current_device = interop.current_device
_capturing = runtime.capturing
_thread_prepared = _C.thread_prepared
_disabled = interop.disabled
_ffn_run = getattr(_C, "ffn_run", None)
_any_autocast = torch._C._is_any_autocast_enabled
_any_requires_grad = torch._C._any_requires_grad
_tracing_state = torch._C._get_tracing_state
_scratch_of = runtime.scratch_table().get
_tensor_layout = _C.tensor_layout
_tensor_signature = _C.tensor_signature
_kept_match = _C.kept_match
_after_ffn = _C.after_ffn
_linear = torch.nn.functional.linear
_empty_like = torch.empty_like
_Module = nn.Module
# the hooks every module runs (torch.nn.modules.module keeps them in these dicts, updated in place)
from torch.nn.modules import module as _nn_module  # noqa: E402
_GLOBAL_HOOKS = (_nn_module._global_backward_pre_hooks, _nn_module._global_backward_hooks,
                 _nn_module._global_forward_pre_hooks, _nn_module._global_forward_hooks)


def _transpose_weights(module, owners):
    """Relay out the ``weight`` of each owner to its transpose, in place (same Parameter objects)."""
    with torch.no_grad():
        for name in owners:
            p = getattr(module, name).weight
            p.data = p.data.t().contiguous()
            if p.grad is not None:
                p.grad = p.grad.t().contiguous()


def _state_dict_hook(module, state_dict, prefix, local_metadata):
    """Save GPT-2 Conv1D weights in their original ``[in, out]`` layout."""
    for name in module.spec.transposed:
        key = prefix + name + ".weight"
        if key in state_dict:
            state_dict[key] = state_dict[key].t().contiguous()
    return state_dict


def _first_of(a, b):
    """True where b's memory follows a's in the same storage (a first), False where a's follows b's, None
    where they are not the two halves of one memory (or not both contiguous tensors of one dtype and device)."""
    if (a.dtype != b.dtype or a.device != b.device or a.shape != b.shape or not a.is_contiguous()
            or not b.is_contiguous() or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()):
        return None
    if b.data_ptr() == a.data_ptr() + a.nbytes:
        return True
    return False if a.data_ptr() == b.data_ptr() + b.nbytes else None


def packed_gate_up(w_gate, w_up, b_gate=None, b_up=None, whole=None, whole_bias=None):
    """The gate and up weights of a gated FFN as one tensor, for one GEMM of both (``_C.eager``'s ``packed``,
    ``packed_bias``, ``pack``), where they are the two row halves of one memory (one Linear of both, as
    Phi-3's ``gate_up_proj``, or packed by ``FusedFFN``) in the same order as their biases (both or neither);
    else None. ``whole``/``whole_bias``: the Parameters they are row slices of, if any, used as they are where
    they are exactly the two halves (autograd then records through them); otherwise a detached view, which
    the eager route uses only where autograd records nothing through the weights (pack bit 2). Bit 1: the
    gate's rows come first.

    Example:
        >>> import torch
        >>> from fuser.module import packed_gate_up
        >>> both = torch.randn(32, 8)
        >>> w, b, bits = packed_gate_up(both[:16], both[16:])
        >>> torch.equal(w, both), b, bits
        (True, None, 3)
        >>> packed_gate_up(torch.randn(16, 8), torch.randn(16, 8)) is None
        True
    """
    if w_gate is None or w_gate.dim() != 2 or (b_gate is None) != (b_up is None):
        return None
    first = _first_of(w_gate, w_up)
    if first is None or (b_gate is not None and _first_of(b_gate, b_up) is not first):
        return None

    def one(a, b, param):
        lo = a if first else b
        shape = (2 * a.shape[0], *a.shape[1:])
        if param is not None and param.shape == shape and param.data_ptr() == lo.data_ptr() and param.is_contiguous():
            return param, True
        return lo.detach().as_strided(shape, (lo.stride(0),) + tuple(lo.stride()[1:])), False

    w, w_grad = one(w_gate, w_up, whole)
    b, b_grad = (None, True) if b_gate is None else one(b_gate, b_up, whole_bias)
    return w, b, int(first) | (0 if w_grad and b_grad else 2)


def _one_allocation(pairs):
    """Each (a, b) pair of Parameters (None pairs skipped) moved into one new tensor, a's rows first: their
    ``.data`` become its two halves, the values unchanged. All pairs or none: where the device has no memory
    for the copies (a model filling its GPU), nothing moves and a warning says the eager route then runs the
    projections apart. Returns whether they moved."""
    try:
        with torch.no_grad():
            moved = [(a, b, torch.cat((a.data.reshape(-1), b.data.reshape(-1))).view((2 * a.shape[0], *a.shape[1:])))
                     for a, b in pairs if a is not None]
    except torch.OutOfMemoryError as e:
        warnings.warn(f"fuser: no memory to put a gated FFN's gate and up weights in one allocation; its eager "
                      f"route runs them as two GEMMs ({str(e).splitlines()[0]})", RuntimeWarning, stacklevel=3)
        return False
    for a, b, both in moved:
        a.data, b.data = both[:a.shape[0]], both[a.shape[0]:]
    return True


class FusedFFN(nn.Module):
    """A transformer FFN computed by ``torch.ops.fuser.ffn`` (one fused kernel on Hopper).

    Usually made by ``fuser.optimize(model)``; ``FusedFFN.from_module(mlp)`` makes one from a single
    FFN module. It holds the original children (and so the original parameters) under their original
    names. In training mode with an active dropout between the GEMMs, and under autocast, it computes
    the same FFN with PyTorch ops instead (the fused op has neither dropout nor autocast). The first
    call of an input shape is routed as ``fuser.ffn`` routes it (validated once, then the fused launch
    or the PyTorch ops); the module keeps that route for the next calls of the shape while nothing it
    depends on changes, and serves them from the module's own ``__call__`` where ``nn.Module.__call__``
    would only reach ``forward`` (no hooks, not ``module.compile()``d, no ``forward`` set on the
    instance). Calls autograd must record, and calls under torch.compile, tracing or a dispatch mode,
    go through ``torch.ops.fuser.ffn``.

    Example:
        >>> import torch, fuser
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> fused = fuser.FusedFFN.from_module(mlp)
        >>> fused.plan_summary()
        'FFN 64 -> 256 -> 64, plain, activation=gelu, dtype=float32, bias=up+down; plan: float32: unfused (PyTorch eager ops)'
        >>> x = torch.randn(3, 64)
        >>> torch.allclose(fused(x), mlp(x), atol=1e-5)
        True
    """

    def __init__(self, spec: FFNSpec, children, linked=None, source=None):
        """Adopt ``children`` (name -> module, the owners ``spec`` names) and compute ``spec``'s FFN.

        ``linked`` maps owner names living outside this module to the modules holding them (their
        parameters stay registered there); ``source`` is the module replaced (kept for ``revert``)."""
        super().__init__()
        if spec.train_source and source is None:
            raise ValueError("source: the module replaced is needed: in training mode its own forward runs "
                             "(spec.train_source)")
        for name, child in children.items():
            self.add_module(name, child)
        if source is not None:
            self.training = source.training   # the children keep their own flags
        self.spec = spec
        self.__dict__["_linked"] = dict(linked or {})   # not registered: their state_dict keys stay put
        self.__dict__["_source"] = source
        if spec.transposed:
            _transpose_weights(self, spec.transposed)
            self._register_state_dict_hook(_state_dict_hook)
        self.pack()

    @classmethod
    def from_module(cls, module):
        """A ``FusedFFN`` for one FFN module (any class ``fuser.optimize`` recognises, except FFNs split
        over two sibling modules, which need their parent: use ``fuser.optimize`` on the parent).

        Raises ``ValueError`` saying why when the module is not a supported FFN.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8)))
            FusedFFN(
              FFN 8 -> 32 -> 8, plain, activation=silu, dtype=float32, bias=up+down; plan: float32: unfused (PyTorch eager ops)
              (0): Linear(in_features=8, out_features=32, bias=True)
              (1): SiLU()
              (2): Linear(in_features=32, out_features=8, bias=True)
            )
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        found = recognise(module)
        if found is None:
            raise ValueError(f"module: {type(module).__name__} is not an FFN fuser recognises")
        kind, spec, linked = found
        if isinstance(spec, NearMiss):
            raise ValueError(f"module: {kind} is not an FFN fuser recognises: {spec}")
        if isinstance(spec, Unsupported):
            raise ValueError(f"module: {kind} cannot be fused: {spec}")
        if spec.linked:
            raise ValueError(f"module: {kind} spans two sibling modules; call fuser.optimize on their parent")
        return cls(spec, dict(module.named_children()), source=module)

    def __getstate__(self):
        # copy.deepcopy and pickling (torch.save of a whole model) leave out the kept route: it holds
        # loaded kernels and DLPack capsules of this process
        state = super().__getstate__()
        state.pop("_kept", None)
        return state

    @property
    def source(self):
        """The module this one replaced (None when made from a spec directly)."""
        return self.__dict__["_source"]

    def restore(self):
        """Hand the children back to the module this one replaced, with GPT-2 Conv1D weights in their
        original layout again, and return that module (what ``fuser.revert`` puts back). Once done, doing
        it again only returns that module."""
        source = self.source
        if self.__dict__.get("_restored"):
            return source
        self.__dict__["_restored"] = True
        self.unpack()
        _transpose_weights(self, self.spec.transposed)
        for name, child in self.named_children():
            setattr(source, name, child)
        source.training = self.training
        self.__dict__.pop("_kept", None)
        return source

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # GPT-2 Conv1D weights arrive in their [in, out] layout; the children load after this runs
        for name in self.spec.transposed:
            key = prefix + name + ".weight"
            if key in state_dict:
                state_dict[key] = state_dict[key].t().contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ---- the weights, read at every call --------------------------------------------------------------

    def _owner(self, ref):
        # straight from the registries where the owner is registered (nn.Module.__getattr__ costs ~0.5 us
        # a lookup, read at every call); getattr for anything else
        owner = self._linked.get(ref.owner)
        if owner is None:
            owner = self._modules.get(ref.owner)
            if owner is None:
                owner = getattr(self, ref.owner)
        return owner

    def _tensor(self, ref):
        owner = self._owner(ref)
        t = owner._parameters.get(ref.name) if isinstance(owner, nn.Module) else None
        if t is None:
            t = getattr(owner, ref.name)
        return t if ref.rows is None else t[ref.rows[0]:ref.rows[1]]

    def weights(self):
        """The tensors fused, by role: ``up``, ``down``, ``gate``, ``b_up``, ``b_gate``, ``b_down``
        (None where absent), each the original parameter or a zero-copy row slice of it.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
            >>> f.weights()["up"] is f.get_submodule("0").weight
            True
        """
        refs = self.__dict__.get("_refs")
        if refs is None:   # the spec is fixed: list its roles once
            refs = self.__dict__["_refs"] = tuple((role, getattr(self.spec, role)) for role in _ROLES)
        return {role: None if ref is None else self._tensor(ref) for role, ref in refs}

    # ---- the gate and up weights in one allocation ---------------------------------------------------

    def _pair(self):
        """The gate's and up's Parameters and those of their biases (None where absent), where they are
        separate plain Parameters (not row slices of one), else None."""
        s = self.spec
        if not s.gated or s.gate.rows is not None or s.up.rows is not None:
            return None
        refs = (s.gate, s.up, s.b_gate, s.b_up)
        ps = []
        for ref in refs:
            owner = None if ref is None else self._owner(ref)
            p = None if ref is None else (owner._parameters.get(ref.name) if isinstance(owner, nn.Module) else None)
            if ref is not None and (type(p) is not nn.Parameter or type(p.data) is not _Tensor):
                return None
            ps.append(p)
        return None if ps[0] is ps[1] else tuple(ps)

    def _gate_up(self, w):
        """The gate and up weights of ``w`` (``weights()``) as one tensor (``packed_gate_up``), or None: the
        Parameter they are row slices of where it is just the two (autograd records through it)."""
        s = self.spec
        if not s.gated:
            return None
        whole = [None, None]
        for i, (a, b) in enumerate(((s.gate, s.up), (s.b_gate, s.b_up))):
            if a is not None and b is not None and a.rows is not None and (a.owner, a.name) == (b.owner, b.name):
                owner = self._owner(a)
                whole[i] = owner._parameters.get(a.name) if isinstance(owner, nn.Module) else None
        return packed_gate_up(w["gate"], w["up"], w["b_gate"], w["b_up"], *whole)

    def pack(self):
        """Put the gate and up weights of a gated 16-bit FFN on a CUDA device into one allocation, the gate's
        rows first (their biases too, where both have one), so that its eager route computes both
        projections as one GEMM (``packed_gate_up``), as PyTorch's cuBLAS does better than two at prefill
        sizes. The same Parameters with the same values: only their memory moves (``.data``), once. Where
        they already are (one Linear of both, or packed before), where anything else differs (dtypes,
        devices, shapes, a bias on one of them only, Parameter subclasses), or elsewhere than on a CUDA
        device, nothing changes. ``fuser.optimize`` does it for every gated FFN it swaps, and the module again
        after ``model.to(...)``, ``.cuda()`` or ``.half()`` gave its Parameters new tensors (``_apply``), until
        ``unpack`` (or ``fuser.revert``) undoes it. Returns whether it moved them.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
            >>> f.pack()   # not gated
            False
        """
        pair = self._pair()
        if pair is None:
            return False
        g, u, bg, bu = pair
        if (g.device.type != "cuda" or g.dtype not in (torch.bfloat16, torch.float16) or g.dim() != 2
                or (bg is None) != (bu is None) or packed_gate_up(g, u, bg, bu) is not None):
            return False
        for a, b in ((g, u), (bg, bu)):
            if a is not None and (a.dtype != b.dtype or a.device != b.device or a.shape != b.shape):
                return False
        self.__dict__.pop("_apart", None)
        if not _one_allocation(((g, u), (bg, bu))):
            return False
        self.__dict__["_packed"] = True
        self.__dict__.pop("_kept", None)
        return True

    def _apply(self, fn, *args, **kwargs):
        # model.to(), .cuda(), .half() give each Parameter a new tensor: packed again where pack applies, unless
        # unpack() asked for them apart
        out = super()._apply(fn, *args, **kwargs)
        if not self.__dict__.get("_apart"):
            self.pack()
        return out

    def unpack(self):
        """Give the gate and up weights (and biases) separate memory again where ``pack`` put them in one
        allocation and they still are, and keep them apart (``model.to(...)`` no longer packs them; ``pack``
        does); returns whether it moved them."""
        self.__dict__["_apart"] = True
        pair = self._pair()
        if not self.__dict__.pop("_packed", False) or pair is None or packed_gate_up(*pair) is None:
            return False
        with torch.no_grad():
            for p in pair:
                if p is not None:
                    p.data = p.data.clone()
        self.__dict__.pop("_kept", None)
        return True

    # ---- forward -------------------------------------------------------------------------------------

    def _mid(self):
        """The dropout between the GEMMs when it is active (training, p > 0), else None."""
        name = self.spec.mid_dropout
        d = self._modules.get(name) if name else None
        return d if d is not None and d.training and getattr(d, "p", 0) > 0 else None

    def _eager(self, x, w, mid=None):
        """The same FFN in PyTorch ops, with the dropout between the GEMMs when it is active."""
        return eager(x, w["up"], w["down"], w["gate"], w["b_up"], w["b_gate"], w["b_down"],
                     ACTIVATIONS[self.spec.activation], mid)

    def __init_subclass__(cls, **kwargs):
        # a class statement gives a subclass the generic call slot; one whose __call__ is still FusedFFN's gets
        # the C slot too (_install_call)
        super().__init_subclass__(**kwargs)
        if cls.__call__ is FusedFFN.__call__:
            _install_call(cls)

    def __call__(self, *args, **kwargs):
        # nn.Module.__call__, less its two frames where they would only reach forward: with one input, no
        # hook (the module's or global), not compiled (module.compile()), forward not replaced on the
        # instance, not under torch.compile or tracing, the kept route of the last shape serves the call
        # directly. Everything else, and every call the kept route declines, is nn.Module.__call__,
        # looked up at each call so that patches of it (torch.fx's tracer) apply.
        # A kept route whose checks C can read (``fast``: the eager ops, or a kept launch) runs its checks, the
        # route and the dropout after it in one C call; a dropout after the FFN that would be the identity is
        # not called.
        if not _is_compiling() and len(args) == 1 and not kwargs:
            d = self.__dict__
            kept = d.get("_kept")
            if kept is not None:
                fast = kept.fast
                if fast is not None:
                    y = kept.run_c(d, args[0], fast)
                    if y is not None:
                        return y
                elif ("forward" not in d and self._compiled_call_impl is None
                        and not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                                 or self._backward_pre_hooks or _GLOBAL_HOOKS[0] or _GLOBAL_HOOKS[1]
                                 or _GLOBAL_HOOKS[2] or _GLOBAL_HOOKS[3] or _tracing_state())):
                    y = kept.run(self, args[0])
                    if y is not None:
                        post = kept.post
                        return y if post is None else _after_ffn(d, post, DROPOUTS, y)
        return _Module.__call__(self, *args, **kwargs)

    def forward(self, x):
        if self.training and self.spec.train_source:   # the module's forward differs in training: run it
            source = self.__dict__["_source"]
            source.training = True
            return source(x)
        y = None
        q = self.__dict__.get("_fp8")
        if q is not None and x.dtype == torch.bfloat16 and not (_grad_enabled() and x.requires_grad):
            y = self._quantized(x, q)
        elif not (_is_compiling() or _is_tracing()):   # compiled and traced graphs keep the op
            kept = self.__dict__.get("_kept")
            if kept is not None:
                y = kept.run(self, x)
        if y is None:
            y = self._route(x)
        post = self.spec.post_dropout
        return y if post is None else self._modules[post](y)

    def _quantized(self, x, q):
        """The quantized FFN (``quantize``) of x: x quantized by the kernel, the biases as they are. Through
        the launch kept for x's shape, else ``fuser.ffn(..., scales=)``, whose fused launch is then kept
        (as ``_route`` keeps a 16-bit one) where the call is a plain CUDA tensor's outside a compile, a
        trace or a mode."""
        kept = self.__dict__.get("_kept")
        if kept is not None:
            y = kept.run(self, x)
            if y is not None:
                return y
        w = self.weights()
        b_up, b_gate, b_down = (None if b is None else b.detach() for b in (w["b_up"], w["b_gate"], w["b_down"]))
        args = (q.w_up, q.w_down, q.w_gate, b_up, b_gate, b_down, self.spec.activation)
        if (_is_compiling() or _is_tracing() or type(x) is not _Tensor or x.device.type != "cuda"
                or _dispatch_modes() or _function_modes()):
            return ops.ffn(x, *args[:2], w_gate=args[2], b_up=b_up, b_gate=b_gate, b_down=b_down,
                           activation=args[6], scales=q.scales)
        xr = interop.ready(x)
        route = ops.route(xr, *args, scales=q.scales)
        scales = ops.scale_tensors(q.scales)
        y = route.run(xr, *args, None, scales)
        if route.fused and not (route.graphs_eager and _capturing()):
            tensors = dict(zip(_ROLES, (q.w_up, q.w_down, q.w_gate, b_up, b_gate, b_down)))
            self.__dict__["_kept"] = _KeptLaunch.bind(self, route, xr, tensors, y, scales)
        return y

    def _route(self, x):
        """A call the kept route does not serve. PyTorch ops where the fused op does not apply (an active
        dropout between the GEMMs, autocast, x in another dtype); the op ``torch.ops.fuser.ffn`` where
        the dispatcher must see the call (torch.compile or tracing, a dispatch or function mode, not a
        plain CPU/CUDA tensor); else the route of x's signature (``fuser.ops.route``: validated the first
        time), run directly and kept for the next calls of this shape. With autograd to record, a route
        runs the eager ops, which record their own backward as the module it replaced did; a fused
        route's launch is then not kept from that call (it serves the calls without autograd)."""
        w = self.weights()
        mid = self._mid()
        if mid is not None or x.dtype != w["up"].dtype or _autocast(x.device.type):
            return self._eager(x, w, mid)
        args = (w["up"], w["down"], w["gate"], w["b_up"], w["b_gate"], w["b_down"], self.spec.activation)
        if (_is_compiling() or _is_tracing() or type(x) is not _Tensor or x.device.type not in ("cuda", "cpu")
                or _dispatch_modes() or _function_modes()):
            return torch.ops.fuser.ffn(x, *args)
        xr = interop.ready(x)
        route = ops.route(xr, *args)
        y = route.run(xr, *args) if route.fused else route.run(xr, *args, pack=self._gate_up(w))
        if (route.fused and ((_grad_enabled() and _any_requires_grad(x, *args[:6]))
                             or (route.graphs_eager and _capturing()))   # (a capture ran the eager ops)
                or self.__dict__.get("_fp8") is not None):   # (quantized: only the calls fp8 cannot take)
            return y
        self.__dict__["_kept"] = (_KeptLaunch.bind(self, route, xr, w, y) if route.fused
                                  else _KeptEager.bind(self, route, x, w))
        return y

    # ---- description ---------------------------------------------------------------------------------

    def plan_args(self):
        """This FFN as the planner sees it: the keyword arguments of ``fuser.plan`` other than the token
        count (widths, gated, activation, the biases present, dtype, and whether a gated 16-bit FFN's gate and
        up weights are packed in one tensor, as ``pack`` leaves them), read from the current weights.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)))
            >>> f.plan_args()
            {'d_model': 8, 'd_ff': 32, 'd_out': 8, 'gated': False, 'activation': 'relu', 'bias': ('up',), 'dtype': 'float32', 'packed': False}
        """
        s = self.spec
        w = self.weights()
        dtype = str(w["up"].dtype).replace("torch.", "")
        return dict(d_model=s.d_model, d_ff=s.d_ff, d_out=s.d_out, gated=s.gated, activation=s.activation,
                    bias=tuple(r[2:] for r in ("b_up", "b_gate", "b_down") if getattr(s, r) is not None),
                    dtype=dtype, packed=dtype in ("bfloat16", "float16") and self._gate_up(w) is not None)

    def plan(self, tokens=PLAN_TOKENS):
        """The plan ``fuser.ffn`` picks for this FFN at ``tokens`` tokens on this machine's GPU (the H200
        defaults without one): ``fuser.plan(tokens, **self.plan_args())``, kept on the module.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).bfloat16())
            >>> f.plan(16).summary() == fuser.plan(16, 64, 256, bias=True, activation="gelu", dtype="bfloat16").summary()
            True
            >>> f.plan(16) is f.plan(16)
            True
        """
        args = self.plan_args()
        key = (tokens,) + tuple(args.items())
        plans = self.__dict__.setdefault("_plans", {})
        if key not in plans:
            plans[key] = planner.plan(tokens, **args)
        return plans[key]

    def plan_summary(self):
        """One line describing the fused chain and the plan the planner picks for it at a representative
        token count (``PLAN_TOKENS``, 128): d_model -> d_ff -> d_out, gated or plain, activation, dtype and
        biases, then the plan. float32 FFNs always run PyTorch ops, so they say so without planning.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32, bias=False), nn.ReLU(),
            ...                                              nn.Linear(32, 8, bias=False)))
            >>> f.plan_summary()
            'FFN 8 -> 32 -> 8, plain, activation=relu, dtype=float32, bias=none; plan: float32: unfused (PyTorch eager ops)'
            >>> f.bfloat16().plan_summary()  # doctest: +ELLIPSIS
            'FFN 8 -> 32 -> 8, ..., dtype=bfloat16, bias=none; plan @128 tokens: ..., predicted ... us'
        """
        args = self.plan_args()
        dtype = args["dtype"]
        form = "gated" if args["gated"] else "plain"
        head = (f"FFN {args['d_model']} -> {args['d_ff']} -> {args['d_out']}, {form}, activation={args['activation']}, "
                f"dtype={dtype}, bias={'+'.join(args['bias']) or 'none'}")
        if dtype not in ("bfloat16", "float16"):
            return f"{head}; plan: {dtype}: unfused (PyTorch eager ops)"
        try:
            return f"{head}; plan @{PLAN_TOKENS} tokens: {self.plan(PLAN_TOKENS).summary()}"
        except ValueError as e:   # nothing the planner can run (it always offers the unfused path)
            return f"{head}; plan @{PLAN_TOKENS} tokens: none ({e})"

    def running(self, tokens=PLAN_TOKENS):
        """What computes this FFN here, as far as is known: PyTorch ops and why (float32, weights not on a
        CUDA device, no fused path on their GPU, ``FUSER_DISABLE``), or what a call of ``tokens`` tokens
        runs on the weights' GPU: the fused kernel; the fused kernel outside CUDA graphs and PyTorch ops in
        them (a host-bound route, ``fuser.route.HostBoundRoute``); or PyTorch ops where the planner predicts
        them faster; then, when the module kept the route of its last input shape, what that call ran.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).bfloat16())
            >>> f.running()
            'runs PyTorch ops here (weights on cpu)'
        """
        w = self.weights()["up"]
        dtype = str(w.dtype).replace("torch.", "")
        if self.__dict__.get("_fp8") is not None:
            return "FP8 (e4m3 weights, static x and H scales): " + self._running_fp8(w, tokens)
        if self.training and self.spec.train_source:
            now = "runs the module's own forward (training mode, where it differs from the FFN)"
        elif dtype not in ("bfloat16", "float16"):
            now = f"runs PyTorch ops ({dtype} is never fused)"
        elif _disabled():
            now = "runs PyTorch ops (FUSER_DISABLE is set)"
        elif w.device.type != "cuda":
            now = f"runs PyTorch ops here (weights on {w.device.type})"
        else:
            ok, why = runtime.fused_available(w.device.index)
            if not ok:
                now = f"runs PyTorch ops here (no fused path on {w.device}: {why})"
            else:
                chain = self.plan(tokens).chain
                p = runtime.plan_for(chain, w.device.index)
                if p.fused:
                    now = f"runs the fused kernel @{tokens} tokens"
                elif runtime.host_bound_plan(chain, w.device.index, p) is not None:
                    now = (f"runs the fused kernel @{tokens} tokens outside CUDA graphs, PyTorch ops in them "
                           "(planner: eager in a graph, where the ops' launches cost the host nothing)")
                else:
                    now = f"runs PyTorch ops @{tokens} tokens (planner: eager)"
        kept = self.__dict__.get("_kept")
        if kept is not None and not kept.route.stale:
            m = math.prod(kept.shape[:-1])
            now += f"; last call ({m} tokens): {'the fused kernel' if kept.route.fused else 'PyTorch ops'}"
        return now

    def quantize(self, x_samples):
        """Run this FFN in FP8 from now on (``fuser.fp8``): its weights quantized to e4m3 per output channel
        and the static scales of x and of the hidden activation calibrated on ``x_samples`` (``[..., d_model]``
        inputs of this FFN), kept beside the original Parameters, which stay (``state_dict`` unchanged) and
        which ``dequantize()`` returns to. A call of a bfloat16 x without autograd to record then runs
        ``fuser.ffn(..., scales=)``; any other call the FFN as before. Refreshes after the weights change are
        the caller's: call ``quantize`` again. Returns ``self``.

        Example:
            >>> import torch, fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).bfloat16())
            >>> x = torch.randn(8, 64).bfloat16()
            >>> y = f.quantize(x)(x)
            >>> y.dtype, f.running().startswith("FP8")
            (torch.bfloat16, True)
        """
        w = self.weights()
        if w["up"].dtype != torch.bfloat16:
            raise ValueError(f"quantize: FP8 FFNs take bfloat16 activations and biases; this FFN is {w['up'].dtype}: "
                             "convert the model first (model.bfloat16())")
        with torch.no_grad():
            gate = None if w["gate"] is None else w["gate"].detach()
            q = fp8.quantize_ffn(w["up"].detach(), w["down"].detach(), w_gate=gate, b_up=w["b_up"], b_gate=w["b_gate"],
                                 x_samples=x_samples.detach(), activation=self.spec.activation)
        self.__dict__["_fp8"] = q
        self.__dict__.pop("_kept", None)   # the kept 16-bit route would bypass forward
        return self

    def dequantize(self):
        """Run this FFN from its Parameters again (undoes ``quantize``). Returns ``self``."""
        self.__dict__.pop("_fp8", None)
        self.__dict__.pop("_kept", None)   # a kept quantized launch
        return self

    def _running_fp8(self, w, tokens):
        """What runs the quantized FFN (``quantize``) at `tokens` tokens here."""
        if w.device.type != "cuda":
            return f"runs fuser.fp8.reference here (weights on {w.device.type})"
        ok, why = runtime.fused_available(w.device.index)
        if not ok:
            return f"runs PyTorch's FP8 ops here (no fused path on {w.device}: {why})"
        p = runtime.plan_for({**self.plan(tokens).chain, "dtype": "float8_e4m3fn", "packed": False}, w.device.index)
        return f"runs the fused kernel @{tokens} tokens" if p.fused else f"runs PyTorch's FP8 ops @{tokens} tokens"

    def extra_repr(self):
        return self.plan_summary()


def _install_call(cls):
    """m(x) of cls's instances through a C call slot: where FusedFFN.__call__ would hand the call to a kept
    route whose checks C reads (``_C.kept_eager``, ``_C.kept_launch``), the slot does so without __call__'s
    Python frame, and a call that route declines goes on to nn.Module.__call__ as __call__ would send it; every
    other call runs __call__ as written, which stays what `cls.__call__` names and torch.compile traces. The slot
    reads torch.compiler's flag that is_compiling() returns outside TorchScript, where torch has it."""
    flag = "_is_compiling_flag" if isinstance(getattr(torch.compiler, "_is_compiling_flag", None), bool) else None
    _C.install_call(cls, _is_compiling, torch.compiler, flag, _Module)


_install_call(FusedFFN)


# ---- the kept route of the last input shape --------------------------------------------------------

class _Weights:
    """A FusedFFN's weights as they were when its route was kept: each owner module in the registry it
    was found in, and each Parameter with its address and shape. ``same(module)`` says whether all
    still hold: in-place updates (``mul_``, optimizer steps, ``load_state_dict``) keep the memory and
    pass; a new Parameter, a new owner or ``.data = ...`` does not. Each row is flat (registry, owner's
    name, owner, its _parameters, parameter name, Parameter, address, shape), and ``layout`` is their
    address, dtype, device, shape and strides as C reads them through torch's DLPack C exchange API
    (``_C.tensor_layout``; None where it cannot, for Parameter subclasses or a torch without that API).
    With a layout the kept routes check x and the weights in one C call (``_C.kept_match``: the two
    dicts of each row, then the layouts); without, ``same`` reads the dicts and two properties of each
    weight here. ``sliced`` (a bit per row) marks the rows whose role is a row slice of its Parameter, and
    ``sliced_layout`` is their layout alone: the eager ops read every other Parameter itself at each
    call, so a kept eager route checks only those rows' layouts (the slices it holds go stale when their
    Parameter's ``.data`` is replaced) and the identity of the rest."""

    __slots__ = ("held", "params", "layout", "sliced", "sliced_layout")

    def __init__(self, module):
        held, sliced = [], 0
        linked, modules = module._linked, module._modules
        for _role, ref in module.__dict__["_refs"]:
            if ref is None:
                continue
            registry = linked if ref.owner in linked else modules   # where module._owner finds it
            owner = registry.get(ref.owner)
            p = owner._parameters.get(ref.name) if isinstance(owner, nn.Module) else None
            if p is None:
                raise LookupError(ref.name)
            sliced |= (ref.rows is not None) << len(held)
            held.append((registry, ref.owner, owner, owner._parameters, ref.name, p, p.data_ptr(), p.shape))
        self.held, self.sliced = tuple(held), sliced
        self.params = tuple(h[5] for h in held)
        self.layout = _tensor_layout(*self.params)   # None: not all describable in C, checked here
        self.sliced_layout = None if self.layout is None else _tensor_layout(
            *(p for i, p in enumerate(self.params) if sliced >> i & 1))

    @classmethod
    def of(cls, module):
        """The weights of `module`, or None where one is not a registered Parameter (nothing is kept)."""
        try:
            return cls(module)
        except LookupError:
            return None

    def same(self, contiguous=False, laid=-1):
        """Every weight held still there, the same Parameter, and those of the rows in the bit mask `laid`
        (all by default) at the same address and shape; with `contiguous`, also still contiguous (a view of
        the same memory and shape may have other strides: ``as_strided``, or ``.t()`` of a square weight)."""
        for i, (registry, name, owner, params, pname, p, ptr, shape) in enumerate(self.held):
            if registry.get(name) is not owner or params.get(pname) is not p or ((laid >> i & 1) and (
                    p.data_ptr() != ptr or p.shape != shape or (contiguous and not p.is_contiguous()))):
                return False
        return True


#: What C reads of every kept route first (python/kept_bind.c's C_* fields): the route (stale?), the dropouts
#: between the GEMMs and after the FFN (their names; the classes whose inactive instance after the FFN is the
#: identity, its call left out), whether the module trains with its own forward, and what else
#: nn.Module.__call__ would consult (the global hook dicts, torch.jit's tracing state).
_CALL_FIELDS = ("route", "mid", "post", "dropouts", "train_source", "hooks", "tracing_state")
#: What ``_C.kept_eager`` reads of a kept eager route (kept_bind.c's K_* fields): the call's fields, the ops
#: (F.linear, the activation) and the weights, kept_match's arguments, the gate and up weights as one tensor
#: where they are (``packed_gate_up``: packed, packed_bias, pack; None, None, 0 elsewhere).
_KeptEagerFast = collections.namedtuple("_KeptEagerFast", (
    *_CALL_FIELDS, "linear", "act", *_ROLES, "signature", "held", "layout", "laid", "packed", "packed_bias", "pack"))
#: What ``_C.kept_launch`` reads of a kept launch (kept_bind.c's L_* fields): the call's fields, the prepared
#: launch and what runs it (``_C.ffn_run``), kept_match's arguments, the device and raw stream prepared for, the scratch table with the stream's
#: key there and the scratch kept, the tensors autograd would record through besides x, whether the route
#: runs the eager ops in graphs, y's shape where it is not x's (None: ``empty_like(x)``), torch's
#: ``_is_any_autocast_enabled`` and ``empty_like``.
_KeptLaunchFast = collections.namedtuple("_KeptLaunchFast", (
    *_CALL_FIELDS, "prepared", "run", "signature", "held", "layout", "device", "stream", "scratches", "skey", "scratch",
    "grad_of", "graphs_eager", "out_shape", "autocast", "empty_like"))


def _packed_rows(module, weights, w):
    """A kept eager route's gate and up weights as one tensor (``packed_gate_up``: packed, packed_bias,
    pack; None, None, 0 where they are not one memory) and the rows kept_match checks for address and layout
    (a bit mask and their layout): the row slices, and where packed the gate's and up's rows (and their
    biases'), since a packed view reads the memory they had when the route was kept."""
    laid, layout = weights.sliced, weights.sliced_layout
    if weights.layout is None:
        return (None, None, 0), laid, layout
    pk = module._gate_up(w)
    if pk is None:
        return (None, None, 0), laid, layout
    row = {role: i for i, role in enumerate(role for role, ref in module.__dict__["_refs"] if ref is not None)}
    for r in ("gate", "up", "b_gate", "b_up"):
        if r in row:
            laid |= 1 << row[r]
    layout = _tensor_layout(*(p for i, p in enumerate(weights.params) if laid >> i & 1))
    return pk, laid, layout


class _KeptEager:
    """An eager route kept for one input shape: the PyTorch ops with the weights as read then (row slices
    included), while x is a plain tensor of that shape, dtype and device and the same Parameters are
    registered. The ops read a whole Parameter as it is at the call, as the module replaced would, so
    only a row slice's Parameter is checked for its address and layout (a slice taken before its
    ``.data`` was replaced reads the old memory); contiguity does not matter to the ops. Autograd,
    autocast and the dropout between the GEMMs are the ops' own business here."""

    __slots__ = ("route", "shape", "dtype", "device", "signature", "weights", "w", "act", "mid", "post",
                 "train_source", "fast")
    run_c = _C.kept_eager   # run with `fast`: checks and ops in one C call

    @classmethod
    def bind(cls, module, route, x, w):
        weights = _Weights.of(module)
        if weights is None:
            return None
        k = cls()
        k.route, k.weights, k.w = route, weights, tuple(w[r] for r in _ROLES)
        k.act, k.mid, k.post = ACTIVATIONS[module.spec.activation], module.spec.mid_dropout, module.spec.post_dropout
        k.train_source = module.spec.train_source
        k.shape, k.dtype, k.device = x.shape, x.dtype, x.device
        # x's exact type, device, dtype and shape as C reads them (None: checked here, weights too)
        k.signature = None if weights.layout is None else _tensor_signature(x)
        packed, laid, layout = _packed_rows(module, weights, w)
        k.fast = None if k.signature is None else _KeptEagerFast(
            route, k.mid, k.post, DROPOUTS, bool(k.train_source), _GLOBAL_HOOKS, _tracing_state,
            _linear, k.act, *k.w, k.signature, weights.held, layout, laid, *packed)
        return k

    def run(self, module, x):
        """The output for `x` (before the dropout after the FFN), or None when the general route has to run."""
        w = self.weights
        if self.signature is not None:
            if _kept_match(x, self.signature, w.held, w.sliced_layout, w.sliced) is None:
                return None
        elif (type(x) is not _Tensor or x.shape != self.shape or x.dtype is not self.dtype or x.device != self.device
                or not w.same(laid=w.sliced)):
            return None
        if self.route.stale or (self.train_source and module.training):
            return None
        w_up, w_down, w_gate, b_up, b_gate, b_down = self.w
        return eager(x, w_up, w_down, w_gate, b_up, b_gate, b_down, self.act,
                     None if self.mid is None else module._mid())


class _KeptLaunch:
    """A fused route kept for one input shape: a launch prepared once (``_C.ffn_prepare``: validated in
    C, tensor maps encoded, parameters filled) with the weights' DLPack capsules, which it holds, the
    scratch and the stream of that moment, so that a call passes C just the addresses of x and y
    (``_C.ffn_run``). C does not see the tensors again, so ``run`` launches only when these checks,
    which cover everything the preparation validated, all hold:

      the call     not compiling or tracing (forward checks), no dispatch or function mode, no autocast,
                   FUSER_DISABLE unset, no autograd to record, no active dropout between the GEMMs, not
                   training a module whose own forward runs then, and for a host-bound route
                   (``graphs_eager``) no CUDA graph being captured (the route runs the eager ops then)
                   and this thread's cuBLAS handles made (``fuser.route.prepare_thread``: a capture needs them);
      x            a plain ``torch.Tensor`` of the same shape and dtype, 16-byte aligned, contiguous, on
                   the kernel's device, which is the current device;
      the stream   the same current stream, whose scratch is still the one kept for it;
      the weights  the same (``_Weights``), contiguous, so the capsules still describe them.

    A quantized FFN's launch (``FusedFFN.quantize``) is kept the same way, prepared with its e4m3 weights and
    scales, which the module holds until ``quantize`` or ``dequantize`` drops the kept launch; its Parameters
    are checked as the biases the launch reads, and only x's autograd matters (the weights' is not recorded).

    The checks run cheapest and most telling first, and each reads torch once (x's address is read
    once, checked for alignment and launched with). Where C can read the tensors (``_Weights.layout``),
    x and the weights are checked in one call (``_C.kept_match``: x's exact type, device, dtype and shape,
    its address where it is contiguous; the weights' registries, addresses, shapes and strides, which
    were contiguous when prepared). Otherwise the general route runs (and validates)."""

    __slots__ = ("route", "shape", "dtype", "device", "stream", "scratch", "skey", "out_shape", "same_shape",
                 "signature", "weights", "prepared", "mid", "post", "train_source", "graphs_eager", "grad_of", "fast")
    run_c = _C.kept_launch   # run with `fast`: run's checks and the launch in one C call

    @classmethod
    def bind(cls, module, route, x, w, y, scales=None):
        """The kept launch of `module` for inputs like `x` (`y`: its output, which the launch is prepared
        with; `w`: the tensors it reads by role; `scales`: a quantized FFN's), or None where the weights
        cannot be kept."""
        weights = _Weights.of(module) if _to_capsule is not None else None
        if weights is None or x.get_device() != route.device or _current_device() != route.device:
            return None
        k = cls()
        k.route, k.weights, k.graphs_eager = route, weights, route.graphs_eager
        k.grad_of = weights.params if scales is None else ()   # (with x: what autograd would record)
        k.device = route.device
        k.shape, k.dtype, k.stream = x.shape, x.dtype, _raw_stream(k.device)
        k.signature = None if weights.layout is None else _tensor_signature(x)
        k.skey = (k.device, k.stream)
        k.out_shape = (*x.shape[:-1], w["down"].shape[0])
        k.same_shape = k.out_shape == tuple(x.shape)       # y = empty_like(x): the cheapest allocation
        k.mid, k.post, k.train_source = module.spec.mid_dropout, module.spec.post_dropout, module.spec.train_source
        k.scratch = route.launch.scratch(x.numel() // x.shape[-1], k.stream)
        # capsules of detached views: they keep the memory they point at alive even if `.data` is replaced
        caps = tuple(None if w[r] is None else _to_capsule(w[r].detach()) for r in _ROLES)
        borrow = sum(1 << (i + 1) for i, c in enumerate(caps) if c is not None)
        kw = {} if scales is None else {"scales": scales}
        k.prepared = route.launch.prepare(x, caps, module.spec.activation, y, k.scratch, k.stream, borrow, **kw)
        k.fast = None if k.signature is None else _KeptLaunchFast(
            route, k.mid, k.post, DROPOUTS, bool(k.train_source), _GLOBAL_HOOKS, _tracing_state,
            k.prepared, _ffn_run, k.signature, weights.held, weights.layout, k.device, k.stream, runtime.scratch_table(),
            k.skey, k.scratch, k.grad_of, bool(k.graphs_eager), None if k.same_shape else k.out_shape,
            _any_autocast, _empty_like)
        return k

    def run(self, module, x):
        """The output for `x` (before the dropout after the FFN) through the kept launch, or None when
        the general route has to run."""
        w = self.weights
        if self.signature is not None:    # x on the kernel's device, contiguous; the weights unchanged
            ptr = _kept_match(x, self.signature, w.held, w.layout)
            if not ptr or ptr & 15:
                return None
        else:
            if type(x) is not _Tensor or x.shape != self.shape or x.dtype is not self.dtype:
                return None
            ptr = x.data_ptr()
            if (ptr & 15 or not x.is_contiguous() or x.get_device() != self.device
                    or not w.same(contiguous=True)):
                return None
        device = self.device
        if (_current_device() != device
                or _dispatch_modes() or _function_modes() or _any_autocast() or _disabled() or self.route.stale
                or (self.train_source and module.training)
                or (_grad_enabled() and _any_requires_grad(x, *self.grad_of))
                or _raw_stream(device) != self.stream or _scratch_of(self.skey) is not self.scratch
                or (self.mid is not None and module._mid() is not None)
                or (self.graphs_eager and (_capturing() or not _thread_prepared(device)))):
            return None
        y = _empty_like(x) if self.same_shape else x.new_empty(self.out_shape)
        _ffn_run(self.prepared, ptr, y)   # y's address read in C
        return y


class FusedInto(nn.Module):
    """Where a linear layer was fused into a sibling ``FusedFFN`` (BERT's ``output.dense``): it keeps
    that layer's ``weight`` and ``bias`` (the same Parameters, the same state_dict keys) and passes its
    input through, since the sibling already applied them.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from fuser.module import FusedInto
        >>> lin = nn.Linear(8, 4)
        >>> skip = FusedInto(lin, "intermediate")
        >>> skip.weight is lin.weight, torch.equal(skip(torch.ones(2, 4)), torch.ones(2, 4))
        (True, True)
    """

    def __init__(self, linear, into):
        super().__init__()
        self.register_parameter("weight", linear.weight)
        self.register_parameter("bias", linear.bias)
        self.into = into
        self.__dict__["_source"] = linear

    def forward(self, x):
        return x

    @property
    def source(self):
        """The linear layer this one stands in for."""
        return self.__dict__["_source"]

    def restore(self):
        """That linear layer, holding this one's weight and bias again (what ``fuser.revert`` puts back)."""
        source = self.source
        source.weight, source.bias = self.weight, self.bias
        return source

    def extra_repr(self):
        return f"{tuple(self.weight.shape)} fused into {self.into}"

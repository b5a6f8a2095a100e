"""``FusedFFN``'s fast paths: the route of its last input shape, kept ready (issue #5, host time per call
outside CUDA graphs): :class:`FastLaunch` for a fused plan, :class:`FastEager` for the PyTorch ops.

The first calls of a shape go the general way (the op validates and plans; then ``ops.run_fused``), and
forward keeps a :class:`FastLaunch`: the loaded kernel, the scratch of the stream, the output shape, and
the weights' DLPack capsules exported once and only ever BORROWED by the launch (``_C.ffn_launch``'s
``borrow`` mask), so that a later call exports just ``x`` and ``y``. Each call checks what can change
between calls, and returns None (the general route runs, and keeps a fresh FastLaunch) when anything did:

  the call     not compiling or tracing, no dispatch or function mode, no autocast, FUSER_DISABLE unset,
               no autograd to record, the dropout between the GEMMs (if any) inactive;
  x            a plain ``torch.Tensor`` of the same shape and dtype, contiguous, 16-byte aligned, on the
               kernel's device, which is the current device;
  the stream   the same current stream, whose scratch is still the one runtime keeps for it;
  the weights  each owner module still registered under its name, holding the same Parameter object at
               the same address with the same shape. In-place updates (``mul_``, optimizer steps,
               ``load_state_dict``) write the memory the capsules point at, so they are seen; a new
               Parameter or ``.data = ...`` changes the object or the address, and the capsules are
               exported again.

The launch validates everything again in C (shapes, dtypes, alignment, the chain of the kernel), so what
the checks above miss raises there instead of running.

Where the route is PyTorch's eager ops (every shape the planner does not fuse), ``FastEager`` keeps the
weights by role and checks only x (shape, dtype, device, contiguity: the route's key) and the weights as
above; autograd, autocast and dropout are the eager ops' own business, as on the general route.
"""
from __future__ import annotations

import torch

from fuser import _C, ops, runtime

_Tensor = torch.Tensor
_to_capsule = ops._to_capsule
_raw_stream = ops._raw_stream
_current_device = ops._current_device
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing
_grad_enabled = torch.is_grad_enabled
_autocast = torch.is_autocast_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_disabled = ops.disabled
_ROLES = ("up", "down", "gate", "b_up", "b_gate", "b_down")   # the order of ffn_launch's arguments 2-7


class _Weights:
    """The module's weights as they were when kept: each owner module by name, and each Parameter with
    its address and shape; ``same(module)`` says whether all still hold."""

    __slots__ = ("owners", "params")

    def __init__(self, module):
        self.owners, self.params = [], []
        for role, ref in module.__dict__["_refs"]:
            if ref is None:
                continue
            owner = module._owner(ref)
            p = owner._parameters.get(ref.name) if isinstance(owner, torch.nn.Module) else None
            if p is None:
                raise LookupError(ref.name)
            self.owners.append((ref.owner, owner))
            self.params.append((owner, ref.name, p, p.data_ptr(), p.shape))

    @classmethod
    def of(cls, module):
        """The weights of `module`, or None where one is not a registered Parameter (nothing is kept)."""
        try:
            return cls(module)
        except LookupError:
            return None

    def same(self, module):
        modules, linked = module._modules, module.__dict__["_linked"]
        for name, owner in self.owners:
            if (linked.get(name) or modules.get(name)) is not owner:
                return False
        for owner, name, p, ptr, shape in self.params:
            if owner._parameters.get(name) is not p or p.data_ptr() != ptr or p.shape != shape:
                return False
        return True

    def need_grad(self):
        return any(p[2].requires_grad for p in self.params)


class FastEager:
    """One input shape's eager route for one FusedFFN: :meth:`run` returns the output of the module's
    PyTorch ops with the kept weights, or None when x or the weights changed."""

    __slots__ = ("shape", "dtype", "device", "contiguous", "weights", "w")

    @classmethod
    def build(cls, module, x, w):
        weights = _Weights.of(module) if type(x) is _Tensor else None
        if weights is None:
            return None
        f = cls()
        f.shape, f.dtype, f.device, f.contiguous = x.shape, x.dtype, x.device, x.is_contiguous()
        f.weights, f.w = weights, w
        return f

    def run(self, module, x):
        if (type(x) is not _Tensor or x.shape != self.shape or x.dtype is not self.dtype
                or x.device != self.device or x.is_contiguous() != self.contiguous
                or not self.weights.same(module)):
            return None
        return module._eager(x, self.w)


class FastLaunch:
    """One input shape's fused launch for one FusedFFN (see the module docstring). Built by
    :meth:`build` right after the general route launched ``plan`` for ``x``; :meth:`run` returns the output,
    or None when the general route has to run instead."""

    __slots__ = ("shape", "dtype", "device", "stream", "out_shape", "kernel", "scratch", "activation",
                 "weights", "caps", "borrow", "dropout")

    @classmethod
    def build(cls, module, plan, x, w):
        """The fast launch of `plan` for inputs shaped like `x` (just launched with weights `w`, the
        module's ``weights()``), or None where it cannot be kept (a weight not held by a module)."""
        weights = _Weights.of(module) if _raw_stream is not None and _to_capsule is not None else None
        if weights is None or type(x) is not _Tensor:
            return None
        f = cls()
        f.weights = weights
        device = x.get_device()
        f.shape, f.dtype, f.device, f.stream = x.shape, x.dtype, device, _raw_stream(device)
        f.out_shape = (*x.shape[:-1], w["down"].shape[0])
        launch = runtime._launch_of(plan, device)
        f.kernel = launch.kernel
        f.scratch = runtime._scratch_fitting(*launch.need(x.numel() // x.shape[-1]), device, f.stream)
        f.activation = module.spec.activation
        f.caps = tuple(None if w[r] is None else _to_capsule(w[r].detach()) for r in _ROLES)
        f.borrow = sum(1 << (i + 1) for i, c in enumerate(f.caps) if c is not None)
        f.dropout = module.spec.mid_dropout
        return f

    def run(self, module, x):
        """The output of `module` for `x` through the kept launch, or None (something changed: the caller
        takes the general route)."""
        if (type(x) is not _Tensor or x.shape != self.shape or x.dtype is not self.dtype
                or not x.is_contiguous() or x.data_ptr() % 16 or x.get_device() != self.device
                or _current_device() != self.device or _dispatch_modes() or _function_modes()
                or _autocast("cuda") or _disabled()):
            return None
        if _grad_enabled() and (x.requires_grad or self.weights.need_grad()):
            return None
        if self.dropout is not None:
            d = getattr(module, self.dropout)
            if d.training and d.p > 0:
                return None
        stream = _raw_stream(self.device)
        if stream != self.stream or runtime._scratch.get((self.device, stream)) is not self.scratch:
            return None
        if not self.weights.same(module):
            return None
        y = x.new_empty(self.out_shape)
        _C.ffn_launch(self.kernel, _to_capsule(x), *self.caps, self.activation, _to_capsule(y),
                      self.scratch.capsule, stream, self.borrow)
        return y

    @staticmethod
    def usable():
        """False while torch.compile or the TorchScript tracer runs forward (the op must stay in the graph)."""
        return not (_is_compiling() or _is_tracing())

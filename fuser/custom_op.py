"""The ``fuser::ffn`` operator: ``fuser.ffn`` as an operator of torch's dispatcher.

Swapped modules (``FusedFFN``) and the ``torch.compile`` backend call ``torch.ops.fuser.ffn``, never
``fuser.ffn`` directly, so that:

- ``torch.compile(..., fullgraph=True)`` traces it as one opaque node (the fake kernel below gives the
  output's shape and dtype from symbolic sizes, no data access), with no graph break;
- CUDA graph capture records it: the implementation allocates its output through torch's caching
  allocator, launches on the current stream, never synchronises and never compiles during replay;
- autograd works: the backward recomputes the intermediate from the saved inputs with plain PyTorch
  ops (the intermediate activation is never saved, as in the fused forward).

Schema::

    fuser::ffn(Tensor x, Tensor w_up, Tensor w_down, Tensor? w_gate, Tensor? b_up, Tensor? b_gate,
               Tensor? b_down, str activation) -> Tensor

Like ``fuser.ffn``, ``x`` may have any leading shape ``[..., d_model]``; the result is ``[..., d_out]``.

The operator is registered with ``torch.library.Library`` and three kernels: the implementation
(CompositeExplicitAutograd: every device), the fake kernel, and an autograd kernel that, when no input
needs a gradient and the tensors are plain CPU or CUDA tensors, hands the call straight to the
implementation, or, where the route of the call's key is kept (``fuser.ops.run_kept``: the tensors read and
validated in C, x contiguous and aligned), runs that route itself. That is what
``torch.library.custom_op`` registers too, less the Python wrappers it adds around each call (a
``torch._dynamo.disable`` frame, output aliasing checks), which cost about as much host time as the
implementation itself. Most of what is left per call is the dispatcher's: parsing the arguments into a
boxed stack, the autograd kernel's Python call and the result's way back (3-5 us on a 2-core CPU with
torch 2.13, where everything after it costs ~2 us over the eager ops).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from fuser import interop, ops
from fuser.reference import ACTIVATIONS

__all__ = []

SCHEMA = ("ffn(Tensor x, Tensor w_up, Tensor w_down, Tensor? w_gate, Tensor? b_up, Tensor? b_gate, "
          "Tensor? b_down, str activation) -> Tensor")


def _impl(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, w_gate: Optional[torch.Tensor],
          b_up: Optional[torch.Tensor], b_gate: Optional[torch.Tensor], b_down: Optional[torch.Tensor],
          activation: str) -> torch.Tensor:
    """``fuser.ffn`` as the operator ``torch.ops.fuser.ffn`` (traceable, capturable, differentiable).

    Arguments are ``fuser.ffn``'s, positional, with the optional ones given as ``None``. ``x`` need not
    be contiguous (a non-contiguous or misaligned ``x`` is copied first); weights must be.

    Example:
        >>> import torch, fuser
        >>> x = torch.randn(2, 3, 8)
        >>> w_up, w_down = torch.randn(32, 8), torch.randn(8, 32)
        >>> torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu").shape
        torch.Size([2, 3, 8])
    """
    if x.layout != torch.strided:   # before ready(): torch cannot make a sparse tensor contiguous
        raise TypeError(f"x: expected a dense (strided) tensor, got layout {x.layout}")
    x = interop.ready(x)
    return ops.route(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation).run(
        x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)


__test__ = {"ffn": _impl.__doc__}


def _fake(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation):
    torch._check(x.dim() >= 1, lambda: "x: expected [..., d_model]")
    torch._check(w_up.dim() == 2 and w_down.dim() == 2, lambda: "w_up, w_down: expected 2-D weights")
    torch._check(x.shape[-1] == w_up.shape[1], lambda: f"x: last dim {x.shape[-1]} != d_model {w_up.shape[1]}")
    torch._check(w_down.shape[1] == w_up.shape[0], lambda: "w_down: d_ff does not match w_up's")
    return x.new_empty((*x.shape[:-1], w_down.shape[0]))


# ---- autograd: recompute the intermediate from the saved inputs --------------------------------------

def _act_backward(name, grad, h):
    """d act(h) / dh * grad, with the ATen kernels eager autograd uses (so gradients match eager)."""
    if name == "relu":
        return torch.ops.aten.threshold_backward(grad, h, 0)
    if name == "silu":
        return torch.ops.aten.silu_backward(grad, h)
    return torch.ops.aten.gelu_backward(grad, h, approximate="tanh" if name == "gelu_tanh" else "none")


def _gradients(saved, need, activation, has_b_down, gy):
    """The gradients of the seven tensor inputs (None where not needed): the intermediate is recomputed
    from the saved inputs (x, w_up, w_down, w_gate, b_up, b_gate) with the ops eager autograd runs."""
    x, w_up, w_down, w_gate, b_up, b_gate = saved
    x2 = x.reshape(-1, x.shape[-1])
    g2 = gy.reshape(-1, gy.shape[-1])
    u = F.linear(x2, w_up, b_up)
    if w_gate is not None:
        g = F.linear(x2, w_gate, b_gate)
        a = ACTIVATIONS[activation](g)
        mid = a * u
    else:
        mid = ACTIVATIONS[activation](u)
    g_mid = g2 @ w_down                                   # [tokens, d_ff]
    if w_gate is not None:
        g_u = g_mid * a
        g_g = _act_backward(activation, g_mid * u, g)
    else:
        g_u, g_g = _act_backward(activation, g_mid, u), None
    dx = dw_up = dw_down = dw_gate = db_up = db_gate = db_down = None
    if need[0]:
        dx = g_u @ w_up
        if g_g is not None:
            dx = dx + g_g @ w_gate
        dx = dx.reshape(x.shape)
    if need[1]:
        dw_up = g_u.t() @ x2
    if need[2]:
        dw_down = g2.t() @ mid
    if need[3] and g_g is not None:
        dw_gate = g_g.t() @ x2
    if need[4] and b_up is not None:
        db_up = g_u.sum(0)
    if need[5] and b_gate is not None and g_g is not None:
        db_gate = g_g.sum(0)
    if need[6] and has_b_down:
        db_down = g2.sum(0)
    return dx, dw_up, dw_down, dw_gate, db_up, db_gate, db_down


_lib = torch.library.Library("fuser", "DEF")
_lib.define(SCHEMA)
_lib.impl("ffn", _impl, "CompositeExplicitAutograd")


def _refuse_nested(x, *args):
    raise TypeError(f"x: expected a dense tensor, got a nested tensor of {x.dtype}; pad it or run the FFN per "
                    f"sequence")


for _key in ("NestedTensorCPU", "NestedTensorCUDA"):   # torch has no kernel of ours for them: say why
    _lib.impl("ffn", _refuse_nested, _key)
torch.library.register_fake("fuser::ffn", _fake, lib=_lib)
_op = torch.ops.fuser.ffn.default
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AFTER_AUTOGRAD_BITS = _AFTER_AUTOGRAD.raw_repr()
_below_autograd = torch._C._AutoDispatchBelowAutograd
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_DK = torch._C.DispatchKey
# What is left below autograd for plain CPU or CUDA tensors (with or without inference mode's
# ADInplaceOrView): nothing but the backend, whose kernel is _impl itself. Any other key (a dispatch
# or function mode's Python key, FakeTensor, functionalization, a tensor subclass) is redispatched.
# As raw bits: a key set's `&` is the AND of its bits, and reading the bits once is the cheapest test.
_PLAIN = frozenset(k.raw_repr() for b in (_DK.CUDA, _DK.CPU)
                   for k in (torch._C.DispatchKeySet(b), torch._C.DispatchKeySet(b).add(_DK.ADInplaceOrView)))


class _Differentiable(torch.autograd.Function):
    """The operator where autograd records it: the call below autograd, the backward ``_gradients``."""

    @staticmethod
    def forward(ctx, keyset, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation):
        with _below_autograd():
            y = _op.redispatch(keyset & _AFTER_AUTOGRAD, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
        ctx.save_for_backward(x, w_up, w_down, w_gate, b_up, b_gate)   # b_down: not needed to recompute
        ctx.activation, ctx.has_b_down = activation, b_down is not None
        return y

    @staticmethod
    def backward(ctx, gy):
        need = ctx.needs_input_grad[1:8]
        return (None, *_gradients(ctx.saved_tensors, need, ctx.activation, ctx.has_b_down, gy), None)


def _autograd(keyset, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation):
    if _grad_enabled() and _any_requires_grad(x, w_up, w_down, w_gate, b_up, b_gate, b_down):
        return _Differentiable.apply(keyset, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
    if keyset.raw_repr() & _AFTER_AUTOGRAD_BITS in _PLAIN:
        # the dispatcher would run _impl next: run it here, without the second hop; and where the call's
        # route is kept (x then contiguous and aligned: ready(x) would be x), run that route directly
        y = ops.run_kept(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
        return y if y is not None else _impl(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)
    with _below_autograd():
        return _op.redispatch(keyset & _AFTER_AUTOGRAD, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation)


_lib.impl("ffn", _autograd, "Autograd", with_keyset=True)

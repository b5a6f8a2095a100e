"""The PyTorch reference for fused FFNs: the definition every fused kernel is held to.

``ffn_reference`` computes exactly::

    plain:  y = act(x @ w_up.T + b_up) @ w_down.T + b_down
    gated:  y = (act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) @ w_down.T + b_down

with GELU exact (erf) for ``"gelu"`` and the tanh approximation for ``"gelu_tanh"``. It is what
``fuser.ffn`` computes wherever the fused path is unavailable, and the tests' oracle
(``compute_dtype=torch.float64``).
"""
from __future__ import annotations

import functools

import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "ffn_reference", "eager"]

_linear = F.linear

#: activation name -> elementwise function (the names fuser accepts everywhere)
ACTIVATIONS = {
    "relu": F.relu,
    "gelu": functools.partial(F.gelu, approximate="none"),
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def ffn_reference(x, w_up, w_down, *, w_gate=None, b_up=None, b_gate=None, b_down=None,
                  activation="gelu", compute_dtype=None):
    """Compute a (gated) FFN with plain PyTorch ops.

    Args:
        x: ``[..., d_model]``.
        w_up, w_gate: ``[d_ff, d_model]`` (``nn.Linear`` layout); ``w_gate`` makes the FFN gated.
        w_down: ``[d_out, d_ff]``.
        b_up, b_gate: ``[d_ff]``; b_down: ``[d_out]``.
        activation: one of ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"silu"``.
        compute_dtype: ``None`` computes in the inputs' dtype, as eager PyTorch would; a dtype (e.g.
            ``torch.float64``) upcasts every tensor first and returns the result in that dtype.

    Example:
        >>> import torch, fuser
        >>> x, w1, w2 = torch.randn(4, 8), torch.randn(16, 8), torch.randn(8, 16)
        >>> fuser.ffn_reference(x, w1, w2, activation="relu").shape
        torch.Size([4, 8])
    """
    act = ACTIVATIONS.get(activation)
    if act is None:
        raise ValueError(f"activation: unknown activation {activation!r}; expected one of "
                         f"{', '.join(ACTIVATIONS)}")
    if compute_dtype is not None:
        def up(t):
            return None if t is None else t.to(compute_dtype)
        x, w_up, w_down, w_gate, b_up, b_gate, b_down = map(up, (x, w_up, w_down, w_gate, b_up, b_gate, b_down))
    return eager(x, w_up, w_down, w_gate, b_up, b_gate, b_down, act)


def eager(x, w_up, w_down, w_gate, b_up, b_gate, b_down, act, mid=None):
    """The FFN in PyTorch ops, arguments positional and unchecked: what every eager route computes (the routes
    make the same calls from C, ``_C.eager``, where a gated chain's activation and product on a Hopper GPU are one
    gate kernel instead, with bitwise the same result).

    ``act`` is the activation function (a value of ``ACTIVATIONS``); ``mid``, if given, is applied
    between the GEMMs (``FusedFFN``'s dropout there).

    Example:
        >>> import torch
        >>> from fuser.reference import ACTIVATIONS, eager, ffn_reference
        >>> x, w1, w2 = torch.randn(4, 8), torch.randn(16, 8), torch.randn(8, 16)
        >>> torch.equal(eager(x, w1, w2, None, None, None, None, ACTIVATIONS["silu"]),
        ...             ffn_reference(x, w1, w2, activation="silu"))
        True
    """
    h = _linear(x, w_up, b_up)
    h = act(_linear(x, w_gate, b_gate)) * h if w_gate is not None else act(h)
    if mid is not None:
        h = mid(h)
    return _linear(h, w_down, b_down)

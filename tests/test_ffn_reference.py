"""fuser.ffn and its reference against an independent float64 computation (numpy + math.erf/tanh), for
every activation, gated and plain, with and without biases, in every dtype."""
import itertools
import math

import numpy as np
import pytest
import torch

import fuser
from conftest import rel_error

_erf = np.vectorize(math.erf)


def act64(name, v):
    """The activations by their definitions, in float64 numpy (independent of torch)."""
    if name == "relu":
        return np.maximum(v, 0.0)
    if name == "gelu":
        return 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    if name == "silu":
        return v / (1.0 + np.exp(-v))
    raise AssertionError(name)


def ffn64(x, w_up, w_down, w_gate=None, b_up=None, b_gate=None, b_down=None, activation="gelu"):
    f = lambda t: None if t is None else t.double().numpy()  # noqa: E731
    x, w_up, w_down, w_gate, b_up, b_gate, b_down = map(f, (x, w_up, w_down, w_gate, b_up, b_gate, b_down))
    x2 = x.reshape(-1, x.shape[-1])
    h = x2 @ w_up.T + (0 if b_up is None else b_up)
    if w_gate is not None:
        h = act64(activation, x2 @ w_gate.T + (0 if b_gate is None else b_gate)) * h
    else:
        h = act64(activation, h)
    y = h @ w_down.T + (0 if b_down is None else b_down)
    return torch.from_numpy(y.reshape(*x.shape[:-1], w_down.shape[0]))


def make(gen, m, k, n, l, gated, bias, dtype):
    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).to(dtype)
    t = dict(x=r(m, k), w_up=r(n, k, scale=k ** -0.5), w_down=r(l, n, scale=n ** -0.5))
    if gated:
        t["w_gate"] = r(n, k, scale=k ** -0.5)
    if bias:
        t["b_up"], t["b_down"] = r(n, scale=0.1), r(l, scale=0.1)
        if gated:
            t["b_gate"] = r(n, scale=0.1)
    return t


# float32 computes far below bf16/fp16 rounding: it pins the definition (erf vs tanh, gate order)
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation,gated,bias",
                         list(itertools.product(["relu", "gelu", "gelu_tanh", "silu"], [False, True], [False, True])))
def test_ffn_matches_float64_definition(activation, gated, bias, dtype):
    gen = torch.Generator().manual_seed(hash((activation, gated, bias, str(dtype))) % 2 ** 31)
    t = make(gen, 37, 48, 136, 40, gated, bias, dtype)
    ref = ffn64(activation=activation, **t)
    y = fuser.ffn(activation=activation, **t)
    assert y.dtype == dtype and y.shape == (37, 40)
    assert rel_error(y, ref) < TOL[dtype]
    y_ref = fuser.ffn_reference(activation=activation, **t)
    assert rel_error(y_ref, ref) < TOL[dtype]
    y64 = fuser.ffn_reference(activation=activation, compute_dtype=torch.float64, **t)
    assert rel_error(y64, ref) < 1e-12


def test_gelu_variants_differ():
    """Guards against erf and tanh GELU being mixed up: on fp32 they differ measurably."""
    gen = torch.Generator().manual_seed(1)
    t = make(gen, 64, 32, 64, 32, False, False, torch.float32)
    t["x"] = t["x"] * 3
    a, b = fuser.ffn(activation="gelu", **t), fuser.ffn(activation="gelu_tanh", **t)
    assert rel_error(a, ffn64(activation="gelu", **t)) < 2e-6
    assert rel_error(b, ffn64(activation="gelu_tanh", **t)) < 2e-6
    assert rel_error(a, b) > 1e-5


@pytest.mark.parametrize("lead", [(), (1,), (5,), (2, 3), (2, 1, 3), (0,), (3, 0)])
def test_leading_dimensions(lead):
    gen = torch.Generator().manual_seed(2)
    w = make(gen, 1, 16, 48, 24, True, True, torch.float32)
    x = torch.randn(*lead, 16, generator=gen)
    w["x"] = x
    y = fuser.ffn(activation="silu", **w)
    assert y.shape == (*lead, 24)
    if x.numel():
        assert rel_error(y, ffn64(activation="silu", **w)) < 2e-6


def test_out_is_written_and_returned():
    gen = torch.Generator().manual_seed(3)
    t = make(gen, 9, 16, 32, 16, False, True, torch.bfloat16)
    out = torch.full((9, 16), float("nan"), dtype=torch.bfloat16)
    y = fuser.ffn(out=out, **t)
    assert y is out and not torch.isnan(out).any()
    assert torch.equal(out, fuser.ffn(**t))


def test_gradients_flow_on_the_reference_path():
    gen = torch.Generator().manual_seed(4)
    t = {k: v.requires_grad_() for k, v in make(gen, 5, 8, 24, 8, True, True, torch.float32).items()}
    fuser.ffn(activation="silu", **t).square().sum().backward()
    grads = {k: v.grad.clone() for k, v in t.items()}
    for v in t.values():
        v.grad = None
    fuser.ffn_reference(activation="silu", **t).square().sum().backward()
    for k, v in t.items():
        assert torch.allclose(grads[k], v.grad), k


def test_other_dlpack_producers_are_accepted():
    np_x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    w1 = torch.randn(32, 16)
    w2 = torch.randn(16, 32)
    y = fuser.ffn(np_x, w1, w2, activation="relu")
    assert rel_error(y, ffn64(torch.from_numpy(np_x), w1, w2, activation="relu")) < 2e-6

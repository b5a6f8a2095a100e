"""The eager route with a caller's ``out=``: the down projection writes into ``out`` itself (python/eager_bind.c's
down_into: ``F.linear``'s out= form, on 2-D views where ``F.linear`` itself runs a 3-D input with a bias as one
addmm), so ``fuser.ffn(..., out=)`` on the eager route costs no copy of y, and later out= calls take the kept route.
Bitwise the ops' result; where it could not be (autograd, a torch mode, another linear, a layout linear would treat
otherwise), a new tensor the caller copies."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fuser
from fuser import _C
from fuser.module import packed_gate_up
from fuser.reference import ACTIVATIONS, eager
from conftest import CudaLooking


def ops_seen(fn):
    """fn()'s result and how often it ran each aten op (the profiler observes without a torch mode)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = fn()
    return y, {e.key: e.count for e in prof.key_averages()}


def copies(seen):
    return seen.get("aten::copy_", 0)


def tensors(shape, gated, bias, dtype=torch.float32, d=16, f=40, l=24, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return (torch.randn(*s, generator=gen) / 4).to(dtype)
    t = dict(x=r(*shape, d), w_up=r(f, d), w_down=r(l, f), w_gate=r(f, d) if gated else None,
             b_up=r(f) if bias else None, b_gate=r(f) if gated and bias else None, b_down=r(l) if bias else None)
    return t


ORDER = ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,bias", [((5,), True), ((5,), False), ((2, 3), True), ((2, 3), False),
                                        ((2, 1, 3), False), ((0,), True)])
@pytest.mark.parametrize("gated,act", [(False, "gelu"), (True, "silu")])
def test_the_down_projection_writes_into_out_with_the_ops_bits(shape, bias, gated, act, dtype):
    t = tensors(shape, gated, bias, dtype)
    args = [t[k] for k in ORDER]
    want = eager(*args, ACTIVATIONS[act])
    out = torch.full_like(want, float("nan"))
    with torch.no_grad():
        _, plain = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], *args))
        y, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS[act], *args, out))
    assert y is out and torch.equal(out, want)
    # no copy of y: only the copies the ops themselves make (a CPU addmm copies its bias into its result)
    assert copies(seen) == copies(plain) and ("aten::addmm" if bias else "aten::mm") in seen, (seen, plain)


def test_a_packed_gate_and_up_writes_into_out_too():
    torch.manual_seed(0)
    f = 40
    x, both, wd, bd = torch.randn(2, 3, 16), torch.randn(2 * f, 16), torch.randn(24, f), torch.randn(24)
    wg, wu = both[:f], both[f:]
    pk = packed_gate_up(wg, wu)
    out = torch.empty(2, 3, 24)
    with torch.no_grad():
        y = _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, bd, *pk, out)
        want = _C.eager(F.linear, ACTIVATIONS["silu"], x, wu, wd, wg, None, None, bd, *pk)
    assert y is out and torch.equal(out, want)


@pytest.mark.parametrize("why", ["autograd", "a dispatch mode", "another linear", "four dimensions with a bias",
                                 "one dimension", "out not compact", "out of another dtype"])
def test_a_new_tensor_where_out_cannot_take_the_ops_result(why):
    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t = tensors((2, 2, 3) if why.startswith("four") else () if why.startswith("one") else (2, 3), False,
                why != "one dimension")
    if why == "autograd":
        t["w_down"].requires_grad_()
    args = [t[k] for k in ORDER]
    want = eager(*args, ACTIVATIONS["relu"])
    out = torch.empty(*want.shape[:-1], 48)[..., :24] if why == "out not compact" else torch.empty(
        want.shape, dtype=torch.float64 if why == "out of another dtype" else want.dtype)
    linear = (lambda *a: F.linear(*a)) if why == "another linear" else F.linear

    def call():
        if why == "a dispatch mode":
            with Seen():
                return _C.eager(linear, ACTIVATIONS["relu"], *args, out)
        return _C.eager(linear, ACTIVATIONS["relu"], *args, out)
    y = call()
    assert y is not out and torch.equal(y, want), why


@pytest.mark.parametrize("gated", [False, True])
def test_fuser_ffn_on_the_eager_route_fills_out_without_a_copy(gated):
    t = tensors((3, 5), gated, True, torch.bfloat16, seed=4)
    act = "silu" if gated else "gelu"
    with torch.no_grad():
        want, plain = ops_seen(lambda: fuser.ffn(activation=act, **t))
        out = torch.full_like(want, float("nan"))
        y, seen = ops_seen(lambda: fuser.ffn(activation=act, out=out, **t))
    assert y is out and torch.equal(out, want)
    assert copies(seen) == copies(plain), (seen, plain)
    with pytest.raises(ValueError, match="out= does not support autograd"):
        fuser.ffn(activation=act, out=out, **dict(t, w_down=t["w_down"].clone().requires_grad_()))


@pytest.mark.parametrize("lead", [(5,), (2, 3), (2, 2, 3)])
def test_an_epilogue_chain_writes_out_over_xs_leading_shape(lead):
    """The epilogue step flattens x to its rows, so its down projection's input is 2-D: an out of x's leading
    shape is filled through its 2-D view, bit for bit the call without out; an out over the same rows in another
    shape is not x's and gets nothing (a new tensor)."""
    t = tensors(lead, False, True, seed=3)
    t["x"] = t["x"].as_subclass(CudaLooking)
    args = [t[k] for k in ORDER]
    with torch.no_grad():
        want, seen = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], *args))
        out = torch.full(want.shape, float("nan"))
        y, seen_out = ops_seen(lambda: _C.eager(F.linear, ACTIVATIONS["relu"], *args, out))
        other = torch.full((*lead[::-1], 24) if len(lead) > 1 else (1, 5, 24), float("nan"))
        z = _C.eager(F.linear, ACTIVATIONS["relu"], *args, other)
    assert seen.get("aten::_addmm_activation") == 1 == seen_out.get("aten::_addmm_activation"), (seen, seen_out)
    assert want.shape == (*lead, 24) and y is out and torch.equal(out, want)
    assert z is not other and torch.equal(z, want) and other.isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(77,), (2, 64)])
@pytest.mark.parametrize("gated,act,bias", [(False, "gelu", False), (False, "relu", True), (False, "gelu_tanh", True),
                                            (False, "relu", False), (True, "silu", True), (True, "silu", False)])
def test_on_a_hopper_gpu_out_holds_the_routes_bits(shape, gated, act, bias):
    """bf16 on the GPU: the epilogue path (ReLU / tanh GELU with an up bias, or ReLU over the zero bias from
    ZERO_BIAS_MIN_TOKENS rows), the in-place activation and the gate kernel each write their down projection into
    out, bit for bit what the same route returns without it."""
    t = {k: None if v is None else v.cuda() for k, v in
         tensors(shape, gated, bias, torch.bfloat16, d=256, f=1024, l=256, seed=5).items()}
    args = [t[k] for k in ORDER]
    with torch.no_grad():
        want = _C.eager(F.linear, ACTIVATIONS[act], *args)
        out = torch.full_like(want, float("nan"))
        y = _C.eager(F.linear, ACTIVATIONS[act], *args, out)
    assert y is out and torch.equal(out, want)


def test_an_out_call_runs_the_kept_route_after_its_first():
    """fuser.ffn(..., out=) finds its route kept under the call's key as a call without out does (out checked in
    the same C call: its shape, writability, no overlap), so its later calls skip the general path's checks; a bad
    out still gets the general path's error."""
    import os
    import sys
    import fuser.ops as fops
    here = os.path.dirname(fops.__file__)
    t = tensors((4, 6), False, True, seed=6)
    with torch.no_grad():
        want = fuser.ffn(activation="relu", **t)
        out = torch.empty_like(want)
        fuser.ffn(activation="relu", out=out, **t)
        frames = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(here):
                frames.append(frame.f_code.co_name)
        out.fill_(float("nan"))
        sys.setprofile(profile)
        try:
            y = fuser.ffn(activation="relu", out=out, **t)
        finally:
            sys.setprofile(None)
        assert y is out and torch.equal(out, want)
        assert frames == ["ffn", "run"], frames          # the kept route's run, no general path
        with pytest.raises(ValueError, match=r"out: expected shape \[4, 6, 24\]"):
            fuser.ffn(activation="relu", out=torch.empty(4, 6, 23), **t)
        with pytest.raises(ValueError, match="out: its memory overlaps w_up"):
            fuser.ffn(activation="relu", out=t["w_up"].view(-1)[:4 * 6 * 24].view(4, 6, 24), **t)
    with pytest.raises(ValueError, match="out: it requires grad"):
        fuser.ffn(activation="relu", out=torch.empty_like(want).requires_grad_(), **t)

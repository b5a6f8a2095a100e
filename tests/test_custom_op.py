"""The fuser::ffn operator: schema, fake kernel and autograd registration checked with torch's own
torch.library.opcheck; outputs and gradients against eager PyTorch autograd."""
import pytest
import torch
import torch.nn.functional as F

import fuser  # noqa: F401  (registers the op)
from fuser.reference import ffn_reference

ACTS = ["relu", "gelu", "gelu_tanh", "silu"]


def make(gated, bias, shape=(2, 5), d=16, f=48, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(dtype).requires_grad_()

    x = r(*shape, d)
    w_up, w_down = r(f, d, scale=d ** -0.5), r(d, f, scale=f ** -0.5)
    w_gate = r(f, d, scale=d ** -0.5) if gated else None
    b_up, b_gate, b_down = (r(f), r(f) if gated else None, r(d)) if bias else (None, None, None)
    return x, w_up, w_down, w_gate, b_up, b_gate, b_down


def test_schema_has_optional_tensors():
    schema = str(torch.ops.fuser.ffn.default._schema)
    assert schema == ("fuser::ffn(Tensor x, Tensor w_up, Tensor w_down, Tensor? w_gate, Tensor? b_up, "
                      "Tensor? b_gate, Tensor? b_down, str activation) -> Tensor")


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(gated, bias):
    args = make(gated, bias)
    torch.library.opcheck(torch.ops.fuser.ffn.default, (*args, "silu" if gated else "gelu"))


def test_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x, w_up, w_down = torch.empty(3, 7, 16), torch.empty(48, 16), torch.empty(24, 48)
        y = torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")
    assert y.shape == (3, 7, 24) and y.dtype == torch.float32


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_and_gradients_match_eager(act, gated, bias):
    args = make(gated, bias, shape=(2, 3, 4))
    y = torch.ops.fuser.ffn(*args, act)
    ref_args = [a.detach().clone().requires_grad_() if a is not None else None for a in args]
    y_ref = ffn_reference(ref_args[0], ref_args[1], ref_args[2], w_gate=ref_args[3], b_up=ref_args[4],
                          b_gate=ref_args[5], b_down=ref_args[6], activation=act)
    torch.testing.assert_close(y, y_ref)
    gy = torch.randn_like(y)
    y.backward(gy)
    y_ref.backward(gy)
    for name, a, b in zip(("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down"), args, ref_args):
        if a is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_only_requested_gradients_are_computed():
    x, w_up, w_down, *_ = make(False, False)
    w_up.requires_grad_(False)
    w_down.requires_grad_(False)
    y = torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")
    gx, = torch.autograd.grad(y.sum(), x)
    expected = ((F.relu(x @ w_up.T) > 0) * (torch.ones_like(y) @ w_down)) @ w_up
    torch.testing.assert_close(gx, expected)


def test_bad_input_raises_clear_error():
    x, w_up, w_down, *_ = make(False, False)
    with pytest.raises(ValueError, match="activation"):
        torch.ops.fuser.ffn(x.detach(), w_up.detach(), w_down.detach(), None, None, None, None, "mish")


def test_copies_and_pickles_leave_out_run_time_state():
    """copy.deepcopy / pickle of a used FusedFFN or Plan drop what forward and the runtime keep per process
    (the kept route, loaded kernels: DLPack capsules and kernel handles cannot be copied); the copy
    computes the same output."""
    import copy
    import pickle

    from torch import nn

    import fuser
    from fuser.module import FusedFFN
    torch.manual_seed(0)
    module = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8)))
    x = torch.randn(3, 8)
    with torch.no_grad():
        y = module(x)
    assert "_kept" in module.__dict__
    capsule = torch._C._to_dlpack_versioned(torch.zeros(1))         # uncopyable, like a kernel handle
    plan = fuser.plan(16, 64, 256, activation="gelu", fused=True)
    plan.__dict__["_launch"] = {0: capsule}
    module.__dict__["_kept"].w = {"up": capsule}
    for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert "_kept" not in twin.__dict__
        torch.testing.assert_close(twin(x), y)
    p2 = copy.deepcopy(plan)
    assert "_launch" not in p2.__dict__ and p2.summary() == plan.summary()


def test_plain_calls_skip_the_second_dispatch_and_modes_still_see_the_op(monkeypatch):
    """Without autograd to record, a call on plain CPU tensors runs the implementation straight from the
    autograd kernel (the dispatcher's next kernel would be that implementation anyway); under a dispatch
    mode, or in inference mode's other key set, the call is redispatched and the mode sees the op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from fuser import custom_op

    class Op:   # _op with its redispatch counted
        def __init__(self, op):
            self.op, self.calls = op, 0

        def redispatch(self, *a):
            self.calls += 1
            return self.op.redispatch(*a)

    counted = Op(custom_op._op)
    monkeypatch.setattr(custom_op, "_op", counted)
    x, w_up, w_down = (t.detach() for t in make(False, False)[:3])
    ref = torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")
    assert counted.calls == 0
    assert torch.allclose(ref, ffn_reference(x, w_up, w_down, activation="relu"), atol=1e-5)

    class Seen(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        y = torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")
    assert "fuser.ffn.default" in Seen.ops and counted.calls == 1
    assert torch.equal(y, ref)
    x.requires_grad_()
    y = torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")   # recorded: the Function path
    assert y.grad_fn is not None and counted.calls == 2

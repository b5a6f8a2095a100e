"""Structural recognition at its edges: FFNs whose forward holds a dropout function (or another dropout
that does nothing at inference) are recognised, and stay exact in training mode; modules shaped like an
FFN that fuser does not match are listed by fuser.report as near misses, each with what differs."""
import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fuser
from fuser.module import FusedFFN
from models import Holder


class Mlp(nn.Module):
    """fc2(act(fc1(x))) with its dropouts written as functions, as transformer classes often do."""

    def __init__(self, forward, p=0.1):
        super().__init__()
        self.fc1, self.fc2, self.p = nn.Linear(16, 48), nn.Linear(48, 16), p
        self.body = forward

    def forward(self, x):
        return self.body(self, x)


ENDS_IN_DROPOUT = {
    "F.dropout(training=self.training)": lambda s, x: F.dropout(s.fc2(F.gelu(s.fc1(x))), s.p, training=s.training),
    "F.dropout positional": lambda s, x: F.dropout(s.fc2(F.gelu(s.fc1(x))), s.p, s.training),
    "torch.dropout": lambda s, x: torch.dropout(s.fc2(F.gelu(s.fc1(x))), s.p, s.training),
    "between and after": lambda s, x: F.dropout(s.fc2(F.dropout(F.gelu(s.fc1(x)), s.p, s.training)), s.p, s.training),
    "F.alpha_dropout": lambda s, x: F.alpha_dropout(s.fc2(F.gelu(s.fc1(x))), s.p, s.training),
    "branch on self.training": lambda s, x: s.fc2(F.gelu(s.fc1(x))) * 0.5 if s.training else s.fc2(F.gelu(s.fc1(x))),
}


@pytest.mark.parametrize("name", ENDS_IN_DROPOUT)
def test_ffn_with_a_dropout_function_is_fused_at_inference_and_exact_in_training(name, op_calls):
    """Recognised from its forward at inference; in training mode, where that forward computes more than
    the FFN, the module's own forward runs (the same dropout mask under the same seed)."""
    model = Holder(Mlp(ENDS_IN_DROPOUT[name])).eval()
    ref = copy.deepcopy(model)
    r = fuser.report(model)
    assert [(e.status, e.kind) for e in r] == [("fusible", "Mlp")], str(r)
    fuser.optimize(model)
    assert isinstance(model.ffn, FusedFFN) and model.ffn.spec.train_source
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    assert op_calls == ["gelu"]
    model.train(), ref.train()
    for seed in (0, 1):
        torch.manual_seed(seed)
        y = model(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    assert op_calls == ["gelu"] and "own forward" in model.ffn.running()
    y.sum().backward()                                   # gradients reach the same Parameters
    assert model.ffn.fc1.weight.grad is not None
    model.eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref.eval()(x), rtol=1e-5, atol=1e-5)
    assert op_calls == ["gelu"] * 2


def test_dropout_function_that_never_drops_keeps_the_fused_op_in_training(op_calls):
    """p=0, or training=False written out: the same FFN in both modes, so training uses fuser's op."""
    for body in (lambda s, x: F.dropout(s.fc2(F.relu(s.fc1(x))), 0.0, s.training),
                 lambda s, x: F.dropout(s.fc2(F.relu(s.fc1(x))), 0.3, training=False)):
        model = fuser.optimize(Holder(Mlp(body)).train())
        assert isinstance(model.ffn, FusedFFN) and not model.ffn.spec.train_source
        model(torch.randn(2, 16)).sum().backward()
    assert op_calls == ["relu"] * 2


def test_a_module_in_training_mode_is_recognised_too():
    model = Holder(Mlp(ENDS_IN_DROPOUT["F.dropout(training=self.training)"])).train()
    fuser.optimize(model)
    assert isinstance(model.ffn, FusedFFN) and model.ffn.spec.train_source and model.ffn.training


@pytest.mark.parametrize("drop", [nn.Dropout1d(0.2), nn.AlphaDropout(0.2), nn.Identity()])
def test_other_dropout_modules_after_the_ffn(drop, op_calls):
    ffn = nn.Sequential(nn.Linear(16, 48), nn.SiLU(), nn.Linear(48, 16), drop)
    model = fuser.optimize(Holder(ffn).eval())
    assert isinstance(model.ffn, FusedFFN)


# ---- near misses -------------------------------------------------------------------------------------

class NormBetween(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 48), nn.LayerNorm(48), nn.Linear(48, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class ConvMlp(nn.Module):
    """An FFN of 1x1 convolutions over NCHW feature maps."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Conv2d(16, 48, 1), nn.GELU(), nn.Conv2d(48, 16, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 48), nn.Linear(48, 16)

    def forward(self, x):
        return self.down(F.relu(self.up(x))) * 0.5


class WithScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 48), nn.Linear(48, 16)
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class Attention(nn.Module):
    """Two Linears and one input, but it mixes tokens: not an FFN, and not a near miss either."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.proj(torch.softmax(q @ k.transpose(-2, -1), -1) @ v)


NEAR_MISSES = [
    (lambda: nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48), nn.GELU(), nn.Linear(48, 16)),
     "Sequential", "a norm (LayerNorm '1') between the two Linears"),
    (NormBetween, "NormBetween", "a norm (LayerNorm 'norm') between the two Linears"),
    (lambda: nn.Sequential(nn.Conv2d(16, 48, 1), nn.GELU(), nn.Conv2d(48, 16, 1)),
     "Sequential", "1x1 convolutions (Conv2d '0', '2') where fuser reads nn.Linear layers"),
    (ConvMlp, "ConvMlp", "1x1 convolutions (Conv2d 'fc1', 'fc2') where fuser reads nn.Linear layers"),
    (Scaled, "Scaled", "its output comes from mul(), not from a Linear"),
    (WithScale, "WithScale", "the module holds tensors of its own (scale)"),
    (lambda: nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16), nn.GELU()),
     "Sequential", "GELU '3' after the down projection"),
    (lambda: nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)),
     "Sequential", "a norm (LayerNorm '0') before the up projection"),
]


@pytest.mark.parametrize("make,kind,reason", NEAR_MISSES, ids=[n[2].split(" (")[0][:24] for n in NEAR_MISSES])
def test_report_names_the_reason_of_each_near_miss(make, kind, reason):
    model = nn.ModuleDict({"a": make(), "b": nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 16))})
    r = fuser.report(model)
    assert [e.status for e in r] == ["fusible"] and [(e.path, e.kind, e.status) for e in r.missed] == [
        ("a", kind, "missed")], str(r)
    assert r.missed[0].detail.startswith(reason), r.missed[0].detail
    text = str(r)
    assert text.splitlines()[0] == "fuser: 1 FFN(s) found: 0 swapped, 1 fusible, 0 skipped; 1 near miss(es), " \
                                   "not recognised as FFNs"
    assert f"  missed   a  [{kind}]  {reason}" in text
    fuser.optimize(model)
    assert type(model["a"]) is not FusedFFN and isinstance(model["b"], FusedFFN)
    with pytest.raises(ValueError, match=re.escape("is not an FFN fuser recognises: " + reason)):
        FusedFFN.from_module(make())


def test_attention_and_cnn_blocks_are_not_near_misses():
    se = nn.Sequential(nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 3))   # not 1x1: not FFN-shaped
    model = nn.ModuleDict({"attn": Attention(), "se": se, "mlp": nn.Sequential(nn.Linear(16, 48), nn.ReLU(),
                                                                               nn.Linear(48, 16), nn.Linear(16, 4))})
    r = fuser.report(model)
    assert not r and not r.missed, str(r)

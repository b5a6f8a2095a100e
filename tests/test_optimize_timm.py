"""fuser.optimize on real timm modules (Mlp in a VisionTransformer, GluMlp with the gate in either half,
SwiGLU), and the timm variants it must leave alone (norm between the GEMMs, 1x1 Conv2d, Sigmoid GLU,
QuickGELU), each skipped with its reason."""
import copy
import functools

import pytest
import torch
from torch import nn

import fuser
import models  # noqa: F401  (makes torchvision, and so timm, importable)
from fuser.module import FusedFFN

from timm.layers import GluMlp, Mlp, QuickGELU, SwiGLU, SwiGLUPacked  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402


def vit(**kw):
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10,
                             **kw).eval()


def wrapped(mlp):
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(64), mlp).eval()


def check_same(model, x, op_calls, activation):
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    with torch.no_grad():
        y, y_ref = model(x), ref(x)
    assert op_calls and set(op_calls) == {activation}
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    return fuser.report(model)


def test_vit_mlp(op_calls):
    model = vit()
    r = check_same(model, torch.randn(2, 3, 32, 32), op_calls, "gelu")
    assert [(e.kind, e.status) for e in r] == [("Mlp", "swapped")] * 2


def test_vit_with_swiglu_packed_gate_first(op_calls):
    model = vit(mlp_layer=SwiGLUPacked, act_layer=nn.SiLU)
    r = check_same(model, torch.randn(2, 3, 32, 32), op_calls, "silu")
    assert [(e.kind, e.status) for e in r] == [("GluMlp", "swapped")] * 2
    f = model.blocks[0].mlp
    assert f.spec.gate.rows == (0, f.spec.d_ff)


@pytest.mark.parametrize("act,name", [(nn.SiLU, "silu"), (nn.GELU, "gelu"),
                                      (functools.partial(nn.GELU, approximate="tanh"), "gelu_tanh")])
def test_glu_mlp_gate_last_by_default(act, name, op_calls):
    model = wrapped(GluMlp(64, 256, act_layer=act))
    x = torch.randn(2, 5, 64)
    with torch.no_grad():   # GluMlp's init_weights makes the gate half near zero: perturb to see the order
        model[1].fc1.weight.normal_(std=0.1)
    check_same(model, x, op_calls, name)
    f = model[1]
    assert isinstance(f, FusedFFN) and f.spec.gate.rows == (128, 256) and f.spec.up.rows == (0, 128)


def test_swiglu(op_calls):
    r = check_same(wrapped(SwiGLU(64, 128)), torch.randn(2, 5, 64), op_calls, "silu")
    assert "bias=up+gate+down" in r.fused[0].detail


@pytest.mark.parametrize("mlp,reason", [
    (lambda: Mlp(64, 128, norm_layer=nn.LayerNorm), "a norm layer (LayerNorm) sits between the GEMMs"),
    (lambda: Mlp(64, 128, use_conv=True), "1x1 Conv2d"),
    (lambda: GluMlp(64, 256), "activation Sigmoid is not one fuser supports"),
    (lambda: Mlp(64, 128, act_layer=QuickGELU), "activation QuickGELU is not one fuser supports"),
    (lambda: Mlp(64, 128, act_layer=nn.Mish), "activation Mish is not one fuser supports"),
], ids=["norm", "conv", "sigmoid", "quick_gelu", "mish"])
def test_unsupported_timm_mlps_are_skipped(mlp, reason):
    model = wrapped(mlp())
    fuser.optimize(model)
    r = fuser.report(model)
    assert len(r) == 1 and r[0].status == "skipped" and reason in r[0].detail, str(r)
    assert not isinstance(model[1], FusedFFN)


def test_timm_mlp_dropout_train_mode_skipped_eval_fused_then_train_falls_back():
    model = wrapped(Mlp(64, 128, drop=0.5))
    model.train()
    assert "active in training mode" in fuser.report(model).skipped[0].detail
    model.eval()
    fuser.optimize(model)
    f = model[1]
    assert isinstance(f, FusedFFN)
    model.train()                           # later training: dropout must still be applied
    x = torch.randn(4, 5, 64)
    torch.manual_seed(3)
    y = model(x)
    ref = copy.deepcopy(model)
    fuser.revert(ref)
    torch.manual_seed(3)
    torch.testing.assert_close(y, ref(x))   # same dropout masks, same result

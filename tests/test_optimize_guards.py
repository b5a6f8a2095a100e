"""What fuser.optimize must leave alone, each with its reason in fuser.report and never an exception:
FFNs whose modules carry hooks (a FusedFFN computes the FFN without calling its modules, so their hooks
would stop firing), and FFNs whose Linears are not plain: quantized (torch.ao), parametrized
(torch.nn.utils.parametrize), weights that are tensor subclasses or sparse."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import fuser
from fuser.module import FusedFFN
from models import Holder, hf, output


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(16, 48), nn.Linear(16, 48), nn.Linear(48, 16)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def seq():
    return nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16))


def only_ffn_skipped(model, reason):
    """fuser.report lists the one FFN of `model` as skipped with `reason`; optimize leaves it as it was
    (the same module, computing the same output); FusedFFN.from_module refuses it saying why."""
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = model(x)
    r = fuser.report(model)
    assert [e.status for e in r] == ["skipped"] and reason in r[0].detail, str(r)
    ffn = model.get_submodule(r[0].path)
    assert fuser.optimize(model) is model and model.get_submodule(r[0].path) is ffn
    assert not any(isinstance(m, FusedFFN) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="cannot be fused"):
        FusedFFN.from_module(ffn)


# ---- hooks ---------------------------------------------------------------------------------------------

def doubling_output(m, inputs, out):
    return out * 2


def doubling_input(m, inputs):
    return (inputs[0] * 2,)


@pytest.mark.parametrize("where", ["linear", "ffn"])
@pytest.mark.parametrize("kind", ["forward", "forward_pre"])
@pytest.mark.parametrize("make", [seq, Gated], ids=["sequential", "traced"])
def test_ffn_with_a_hook_is_skipped_and_the_hook_keeps_firing(make, kind, where):
    """Both kinds of forward hook, on a Linear and on the FFN module itself, change the output here: the
    FFN stays as it is, so they keep firing, and the output stays what the hooks make it."""
    ffn = make()
    target = ffn if where == "ffn" else next(m for m in ffn.modules() if isinstance(m, nn.Linear))
    if kind == "forward":
        target.register_forward_hook(doubling_output)
    else:
        target.register_forward_pre_hook(doubling_input)
    what = "forward hook" if kind == "forward" else "forward pre-hook"
    on = "the FFN module" if where == "ffn" else "module '"
    only_ffn_skipped(Holder(ffn), f"a {what} on {on}")
    unhooked = copy.deepcopy(ffn)
    unhooked._forward_hooks.clear()
    unhooked._forward_pre_hooks.clear()
    for m in unhooked.modules():
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert not torch.allclose(ffn(x), unhooked(x))    # the hook matters: fusing would change the output


def test_backward_hooks_and_a_replaced_forward_are_refused_too():
    ffn = seq()
    ffn[2].register_full_backward_hook(lambda m, gi, go: None)
    only_ffn_skipped(Holder(ffn), "a backward hook on module '2'")
    ffn = seq()
    ffn[0].forward = lambda x: F.linear(x, ffn[0].weight, ffn[0].bias) * 2   # what accelerate's hooks do
    only_ffn_skipped(Holder(ffn), "the forward of module '0' is replaced on the instance")


def test_hooked_known_classes_and_pairs_are_skipped():
    model, inputs = hf("llama")
    model.model.layers[0].mlp.down_proj.register_forward_hook(doubling_output)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    r = fuser.report(model)
    assert [e.status for e in r] == ["skipped", "swapped"] and "forward hook on module 'down_proj'" in r[0].detail
    with torch.no_grad():
        torch.testing.assert_close(output(model, inputs), output(ref, inputs), rtol=1e-5, atol=1e-5)
    model, inputs = hf("bert")       # BERT's down projection lives in the sibling BertOutput
    model.encoder.layer[1].output.dense.register_forward_pre_hook(doubling_input)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    assert [e.status for e in fuser.report(model)] == ["swapped", "skipped"]
    assert "forward pre-hook on module 'output.dense'" in fuser.report(model)[1].detail
    with torch.no_grad():
        torch.testing.assert_close(output(model, inputs), output(ref, inputs), rtol=1e-5, atol=1e-5)


def test_hooks_on_the_fused_module_fire():
    """After optimize, the FusedFFN is a module like any other: hooks registered on it fire."""
    model = fuser.optimize(Holder(seq()))
    seen = []
    model.ffn.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model(torch.randn(2, 16))
    assert seen == [torch.Size([2, 16])]


# ---- Linears that are not plain ------------------------------------------------------------------------

def quantized(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch.ao.quantization's deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


@pytest.mark.parametrize("make", [seq, Gated], ids=["sequential", "traced"])
def test_dynamically_quantized_linears_are_skipped(make):
    only_ffn_skipped(quantized(Holder(make())), "a quantized linear layer")


def test_dynamically_quantized_llama_is_reported_not_raised():
    model, inputs = hf("llama")
    model = quantized(model)
    with torch.no_grad():
        before = output(model, inputs)
    r = fuser.report(model)
    assert [e.status for e in r] == ["skipped"] * 2, str(r)
    assert "up projection 'up_proj' is torch.ao.nn.quantized.dynamic" in r[0].detail
    fuser.optimize(model)
    with torch.no_grad():
        torch.testing.assert_close(output(model, inputs), before, rtol=0, atol=0)


class Doubled(nn.Module):
    def forward(self, w):
        return w * 2


@pytest.mark.parametrize("make", [seq, Gated], ids=["sequential", "traced"])
def test_parametrized_linears_are_skipped(make):
    ffn = make()
    parametrize.register_parametrization(next(m for m in ffn.modules() if isinstance(m, nn.Linear)), "weight",
                                         Doubled())
    only_ffn_skipped(Holder(ffn), "a Linear with a parametrization of weight")


def test_qat_linear_is_skipped():
    ffn = seq()
    ffn[2] = torch.ao.nn.qat.Linear(48, 16, qconfig=torch.ao.quantization.get_default_qat_qconfig())
    only_ffn_skipped(Holder(ffn), "torch.ao.nn.qat.modules.linear.Linear, a quantized linear layer")


class Scaled(torch.Tensor):
    """A tensor subclass standing for quantized or sharded weights (torchao, DTensor)."""


def test_weights_that_are_not_plain_tensors_are_skipped():
    ffn = seq()
    ffn[0].weight = nn.Parameter(ffn[0].weight.detach().as_subclass(Scaled))
    only_ffn_skipped(Holder(ffn), "0.weight is a Scaled, a tensor subclass")
    ffn = seq()
    ffn[2].weight = nn.Parameter(ffn[2].weight.detach().to_sparse())   # F.linear itself refuses this one
    assert "2.weight is torch.sparse_coo, not a dense tensor" in fuser.report(Holder(ffn))[0].detail


def test_identity_between_the_linears_in_training_mode():
    """An nn.Identity where a dropout may stand: no p to read, never an exception."""
    ffn = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Identity(), nn.Linear(48, 16))
    model = fuser.optimize(Holder(ffn).train())
    x = torch.randn(3, 16)
    torch.testing.assert_close(model.ffn(x), model.ffn.source(x))

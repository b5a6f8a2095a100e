"""fuser.optimize / fuser.report on real Hugging Face models built from configs (random weights, nothing
downloaded): each FFN class is found and swapped, the fused op computes the outputs, which equal the
unswapped model's, state_dicts round-trip both ways with identical keys, gradients match, and
unsupported activations are skipped with their reason."""
import copy

import pytest
import torch

import fuser
from fuser.module import FusedFFN, FusedInto
from models import HF, UNSUPPORTED_ACT, assert_same_grads, hf, output

NAMES = sorted(HF)


@pytest.mark.parametrize("name", NAMES)
def test_report_finds_and_optimize_swaps(name, op_calls):
    model, inputs = hf(name)
    _, kind, count, activation = HF[name]
    before = fuser.report(model)
    assert [e.status for e in before] == ["fusible"] * count and {e.kind for e in before} == {kind}
    ref = copy.deepcopy(model)
    assert fuser.optimize(model) is model
    after = fuser.report(model)
    assert [e.status for e in after] == ["swapped"] * count, str(after)
    assert [e.path for e in after] == [e.path for e in before]
    fused = [m for m in model.modules() if isinstance(m, FusedFFN)]
    assert len(fused) == count and {f.spec.activation for f in fused} == {activation}
    with torch.no_grad():
        y, y_ref = output(model, inputs), output(ref, inputs)
    assert op_calls and set(op_calls) == {activation}
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trips(name):
    model, inputs = hf(name)
    plain_sd = {k: v.clone() for k, v in model.state_dict().items()}
    other, _ = hf(name)
    torch.manual_seed(1)
    for p in other.parameters():   # different weights, to see that loading really loads
        torch.nn.init.normal_(p, std=0.02)
    fuser.optimize(other)
    fused_sd = other.state_dict()
    assert list(fused_sd) == list(plain_sd)
    assert all(fused_sd[k].shape == plain_sd[k].shape for k in plain_sd)
    # unoptimized checkpoint -> optimized model
    other.load_state_dict(plain_sd)
    for k, v in other.state_dict().items():
        assert torch.equal(v, plain_sd[k]), k
    with torch.no_grad():
        torch.testing.assert_close(output(other, inputs), output(model, inputs), rtol=1e-5, atol=1e-5)
    # optimized checkpoint -> unoptimized model
    fresh, _ = hf(name)
    torch.manual_seed(2)
    for p in fresh.parameters():
        torch.nn.init.normal_(p, std=0.02)
    fresh.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(output(fresh, inputs), output(model, inputs), rtol=1e-5, atol=1e-5)


def test_parameters_are_shared_not_copied():
    model, _ = hf("llama")
    mlp = model.model.layers[0].mlp
    w = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    fuser.optimize(model)
    fused = model.model.layers[0].mlp
    got = fused.weights()
    assert got["gate"] is w[0] and got["up"] is w[1] and got["down"] is w[2]


def test_phi3_halves_are_views_of_the_fused_weight():
    model, _ = hf("phi3")
    w = model.model.layers[0].mlp.gate_up_proj.weight
    fuser.optimize(model)
    got = model.model.layers[0].mlp.weights()
    d_ff = w.shape[0] // 2
    assert got["gate"].data_ptr() == w.data_ptr() and torch.equal(got["gate"], w[:d_ff])
    assert got["up"].data_ptr() == w[d_ff:].data_ptr() and got["up"].is_contiguous()


def test_gpt2_conv1d_relaid_out_once_same_parameter():
    model, _ = hf("gpt2")
    p = model.transformer.h[0].mlp.c_fc.weight
    original = p.detach().clone()          # Conv1D layout [in, out]
    fuser.optimize(model)
    fused = model.transformer.h[0].mlp
    assert fused.c_fc.weight is p and p.is_contiguous()
    assert torch.equal(p, original.t())    # now [out, in], the same Parameter object
    assert fused.weights()["up"] is p
    assert torch.equal(model.state_dict()["transformer.h.0.mlp.c_fc.weight"], original)
    fuser.revert(model)
    assert type(model.transformer.h[0].mlp).__name__ == "GPT2MLP" and torch.equal(p, original)


def test_bert_keeps_dropout_residual_and_layernorm():
    model, _ = hf("bert")
    layer = model.encoder.layer[0]
    ln, w_down = layer.output.LayerNorm, layer.output.dense.weight
    fuser.optimize(model)
    assert isinstance(layer.intermediate, FusedFFN) and isinstance(layer.output.dense, FusedInto)
    assert layer.output.LayerNorm is ln and layer.output.dense.weight is w_down
    assert layer.intermediate.weights()["down"] is w_down


@pytest.mark.parametrize("name,override,reason", UNSUPPORTED_ACT, ids=[u[0] for u in UNSUPPORTED_ACT])
def test_unsupported_activation_is_skipped_with_reason(name, override, reason):
    model, inputs = hf(name, **override)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    r = fuser.report(model)
    assert r and not r.fused and len(r.skipped) == HF[name][2]
    assert all(reason in e.detail and "not one fuser supports" in e.detail for e in r.skipped), str(r)
    assert not any(isinstance(m, FusedFFN) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(output(model, inputs), output(ref, inputs))


def test_t5_dropout_in_training_is_skipped_then_fused_in_eval():
    model, _ = hf("t5")
    model.train()
    r = fuser.report(model)
    assert len(r.skipped) == 4 and "active in training mode" in r.skipped[0].detail
    model.eval()
    assert len(fuser.report(model).fusible) == 4


def test_mixed_dtype_t5_is_skipped():
    model, _ = hf("t5")
    for block in model.encoder.block:
        block.layer[-1].DenseReluDense.wo.half()
    r = fuser.report(model)
    assert any("mixed dtypes" in e.detail for e in r.skipped), str(r)


def test_llama_mlp_bias_is_fused():
    model, inputs = hf("llama", mlp_bias=True)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    assert "bias=up+gate+down" in fuser.report(model).fused[0].detail
    with torch.no_grad():
        torch.testing.assert_close(output(model, inputs), output(ref, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "phi3", "gpt2", "bert", "t5"])
def test_gradients_match_unoptimized(name, op_calls):
    model, inputs = hf(name)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    loss = output(model, inputs).square().mean()
    loss_ref = output(ref, inputs).square().mean()
    loss.backward()
    loss_ref.backward()
    assert op_calls
    assert_same_grads(model, ref)


def test_training_step_updates_fused_parameters():
    model, inputs = hf("llama")
    fuser.optimize(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.model.layers[0].mlp.up_proj.weight
    before = w.detach().clone()
    output(model, inputs).logsumexp(-1).mean().backward()
    opt.step()
    assert not torch.equal(before, w.detach())

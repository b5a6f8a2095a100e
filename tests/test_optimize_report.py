"""What fuser.report says about a swapped FFN (its label is "swapped", and its line ends with what runs
it here: the fused kernel, or PyTorch ops and why), and what fuser.optimize does with a model that is
itself one FFN (it returns the FusedFFN to use, the same one when asked again; revert gives the module
back)."""
import copy
import types

import pytest
import torch
from torch import nn

import fuser
from fuser import runtime
from fuser.module import FusedFFN
from models import Holder, hf


def seq():
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def test_report_labels_swapped_ffns_with_what_runs_them():
    model = fuser.optimize(Holder(seq()))
    line = str(fuser.report(model)).splitlines()
    assert line[0] == "fuser: 1 FFN(s) found: 1 swapped, 0 fusible, 0 skipped"
    assert line[1].startswith("  swapped  ffn  [Sequential]  FFN 16 -> 64 -> 16, plain, activation=gelu, dtype=float32")
    assert line[1].endswith("; plan: float32: unfused (PyTorch eager ops); runs PyTorch ops (float32 is never fused)")
    model.bfloat16()
    assert fuser.report(model)[0].detail.endswith("; runs PyTorch ops here (weights on cpu)")
    with torch.no_grad():
        model(torch.randn(3, 4, 16, dtype=torch.bfloat16))
    assert fuser.report(model)[0].detail.endswith(
        "; runs PyTorch ops here (weights on cpu); last call (12 tokens): PyTorch ops")
    assert fuser.report(model).swapped == fuser.report(model).fused == list(fuser.report(model))


@pytest.mark.parametrize("available,fused,host_bound,says", [
    (True, True, None, "runs the fused kernel @128 tokens"),
    (True, False, False, "runs PyTorch ops @128 tokens (planner: eager)"),
    (True, False, True, "runs the fused kernel @128 tokens outside CUDA graphs, PyTorch ops in them (planner: "
                        "eager in a graph, where the ops' launches cost the host nothing)"),
    (False, None, None, "runs PyTorch ops here (no fused path on cuda:0: no CUDA driver)"),
])
def test_running_on_a_gpu_says_whether_the_fused_kernel_runs(monkeypatch, available, fused, host_bound, says):
    """What a 128-token call would run with the weights on a GPU (faked here: the weights' dtype and device,
    the fused path, the plan the route would take in a graph and whether outside graphs it is host-bound)."""
    f = FusedFFN.from_module(seq())
    gpu_weight = types.SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda", 0))
    monkeypatch.setattr(FusedFFN, "weights", lambda self: {"up": gpu_weight})
    monkeypatch.setattr(runtime, "fused_available", lambda device: (available, "" if available else "no CUDA driver"))
    monkeypatch.setattr(runtime, "plan_for", lambda chain, device: types.SimpleNamespace(fused=fused))
    asked = []
    monkeypatch.setattr(runtime, "host_bound_plan",
                        lambda chain, device, p: asked.append(p.fused) or ("PLAN" if host_bound else None))
    assert f.running() == says
    assert asked == ([] if host_bound is None else [False])     # asked only where the graph plan is eager
    monkeypatch.setenv("FUSER_DISABLE", "1")
    assert f.running() == "runs PyTorch ops (FUSER_DISABLE is set)"


def gpt2_mlp():
    model, _ = hf("gpt2")
    return copy.deepcopy(model.transformer.h[0].mlp)


@pytest.mark.parametrize("make", [seq, gpt2_mlp], ids=["sequential", "gpt2"])
def test_a_model_that_is_one_ffn_comes_back_as_its_fused_module(make):
    """It cannot change in place (no parent to swap it in): optimize returns the FusedFFN to use, which
    takes over its children (GPT-2's Conv1D weights relaid out once); asked again, optimize returns the
    same FusedFFN, so calling it twice stays harmless; revert, once or twice, gives the module back."""
    torch.manual_seed(0)
    mlp = make().eval()
    ref = copy.deepcopy(mlp)
    x = torch.randn(3, 64 if make is gpt2_mlp else 16)
    fused = fuser.optimize(mlp)
    assert isinstance(fused, FusedFFN) and fused.source is mlp and not fused.training
    assert fuser.optimize(mlp) is fused and fuser.optimize(fused) is fused
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    assert fuser.revert(fused) is mlp and fuser.revert(fused) is mlp
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), ref(x), rtol=1e-5, atol=1e-5)
    again = fuser.optimize(mlp)
    assert again is not fused and isinstance(again, FusedFFN)
    with torch.no_grad():
        torch.testing.assert_close(again(x), ref(x), rtol=1e-5, atol=1e-5)

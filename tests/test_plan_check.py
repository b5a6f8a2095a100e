"""The GPU correctness check (tests/gpu/plan_check.py) run on the CPU, where fuser.ffn runs a plan without a
GPU: it passes a correct run and fails an output left partly unwritten, a wrong answer and runs that
differ, so the GPU matrices built on it can fail."""
import os
import sys

import pytest
import torch

import fuser

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))
import plan_check  # noqa: E402


@pytest.fixture
def case():
    plan = fuser.plan(7, 64, 256, d_out=48, gated=True, activation="silu", bias=True, dtype="bfloat16",
                      target="h200", fused=True, kind="stream", bm=16)
    t = plan_check.ffn_tensors(torch.Generator().manual_seed(3), 7, 64, 256, 48, gated=True, bias=True,
                               dtype="bfloat16")
    return plan, t


def test_tensor_shapes_and_scale():
    t = plan_check.ffn_tensors(torch.Generator().manual_seed(0), 5, 512, 2048, 96, gated=True, bias=True,
                               dtype=torch.float16)
    assert {k: tuple(v.shape) for k, v in t.items()} == dict(
        x=(5, 512), w_up=(2048, 512), w_gate=(2048, 512), w_down=(96, 2048), b_up=(2048,), b_gate=(2048,),
        b_down=(96,))
    assert all(v.dtype == torch.float16 for v in t.values())
    assert 0.8 < float(t["w_up"].float().std() * 512 ** 0.5) < 1.2


def test_correct_run_passes(case):
    plan, t = case
    res = plan_check.check_plan(plan, "silu", t)
    assert res["ok"] and not res["nan"] and res["identical"] and res["err"] <= 2 * res["eager_err"]


@pytest.mark.parametrize("fault", ["unwritten", "wrong", "nondeterministic"])
def test_faults_fail(case, fault, monkeypatch):
    plan, t = case
    real, calls = fuser.ffn, []

    def faulty(**kw):
        real(**kw)
        calls.append(1)
        if fault == "unwritten":
            kw["out"][-1, -1] = float("nan")
        elif fault == "wrong":
            kw["out"].mul_(1.05)
        elif len(calls) == 2:
            kw["out"][0, 0] += 1
    monkeypatch.setattr(fuser, "ffn", faulty)
    assert not plan_check.check_plan(plan, "silu", t)["ok"]

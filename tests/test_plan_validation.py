"""Plans are validated, never trusted: ``Plan.from_dict`` and ``fuser.ffn(plan=...)`` check a plan
against the GPU it will run on (not the target a dict carries), before any code is generated; every
field of a plan dict is read exactly (ints range-checked without wrap-around or truncation, strings
whole, bools only True/False), and the constraints of ``fuser.plan`` likewise."""
import copy
import json
import pickle
import re

import pytest
import torch

import fuser
from fuser import _C, ops

H200 = _C.targets()["h200"]
BIG = dict(H200, name="h200", smem_per_block=1_000_000, smem_per_sm=1_000_000)
#: a cluster plan of ~580 kB of shared memory per block that is legal in every other respect
HUGE_SMEM = dict(bm=128, bn=256, bl=128, stages=8, n_iters=1, order="l_outer")


def base(**kw):
    """A fused cluster plan as to_dict writes it (then through JSON)."""
    p = fuser.plan(64, 768, 3072, activation="gelu", fused=True, kind="cluster", target="h200", **kw)
    return json.loads(json.dumps(p.to_dict()))


def stream():
    p = fuser.plan(16, 1024, 4096, gated=True, activation="silu", fused=True, kind="stream", bm=16, target="h200")
    return json.loads(json.dumps(p.to_dict()))


def edited(d, path, value):
    d = copy.deepcopy(d)
    *keys, last = path
    node = d
    for k in keys:
        node = node[k]
    node[last] = value
    return d


def test_the_target_inside_a_dict_does_not_raise_the_limits():
    d = base()
    d["params"].update(HUGE_SMEM)
    assert _C.derive(d, BIG).to_dict()["derived"]["smem_bytes"] > 2 * H200["smem_per_block"]   # legal on the bigger GPU
    d["target"] = BIG                                  # the dict claims a GPU with 1 MB per block
    with pytest.raises(ValueError, match=r"bytes of shared memory per block exceed h200's 232448"):
        fuser.Plan.from_dict(d)
    d["target"] = dict(BIG, name="my-gpu")             # not a built-in: this machine's target decides
    with pytest.raises(ValueError, match="shared memory per block exceed"):
        fuser.Plan.from_dict(d)
    q = fuser.Plan.from_dict(d, target=BIG)            # the caller's own target is the caller's choice
    assert q.target["smem_per_block"] == BIG["smem_per_block"]


def test_a_core_plan_is_checked_against_the_target_it_is_given_like_its_dict():
    d = base()
    d["params"].update(HUGE_SMEM)
    big = _C.derive(d, BIG)                            # a _C.Plan derived for a GPU with 1 MB per block
    assert isinstance(big, _C.Plan) and big.fused
    with pytest.raises(ValueError, match=r"bytes of shared memory per block exceed h200's 232448"):
        _C.derive(big, "h200")
    with pytest.raises(ValueError, match=r"bytes of shared memory per block exceed h200's 232448"):
        _C.codegen(big, "h200")
    with pytest.raises(ValueError, match=r"bytes of shared memory per block exceed h200's 232448"):
        _C.derive(big.to_dict(), "h200")


@pytest.mark.parametrize("kw", [dict(fused=False), dict(fused=True, kind="cluster"), dict(fused=True, kind="stream"),
                                dict(fused=True, kind="stream", bm=16, s1=1, s2=4), dict(gated=True, activation="silu"),
                                dict(fused=True, kind="stream", phases=1, bm=64)])
def test_a_core_plan_and_its_dict_derive_alike_on_every_target(kw):
    kw = dict(dict(activation="gelu"), **kw)
    for m in (1, 64, 300):
        for p in fuser.plans(m, 1024, 4096, target="h200", k=4, **kw):
            for target in ("h200", "h100", BIG):
                try:
                    want = _C.derive(p.raw, target).to_dict()
                except ValueError as e:
                    with pytest.raises(ValueError, match="plan: "):
                        _C.derive(p.core, target)
                    continue
                assert _C.derive(p.core, target).to_dict() == want, (m, kw, target)
            if p.fused:
                assert _C.codegen(p.core, "h200") == _C.codegen(p.raw, "h200")


def test_the_core_plan_type_is_made_by_the_core_only_and_round_trips():
    p = fuser.plan(64, 768, 3072, activation="gelu", fused=True, kind="stream", target="h200")
    c = p.core
    with pytest.raises(TypeError):
        _C.Plan()
    with pytest.raises(AttributeError):
        c.fused = False
    with pytest.raises(TypeError, match="a plan dict becomes a Plan through Plan.from_dict"):
        fuser.Plan(p.raw)
    assert c.to_dict() == p.raw and c.to_dict() is not c.to_dict() and c.predicted_us == p.predicted_us
    for q in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c)):
        assert isinstance(q, _C.Plan) and q.to_dict() == c.to_dict()
    assert pickle.loads(pickle.dumps(p)) == p and "fused, m=64, stream" in repr(c)
    found, _ = _C.search(p.chain, "h200", k=2)
    assert all(isinstance(f, _C.Plan) for f in found)


def test_ffn_checks_a_plan_against_the_gpu_of_x_before_generating_code(monkeypatch):
    d = base()
    d["params"].update(HUGE_SMEM)
    hyp = fuser.Plan(_C.derive(d, BIG), {"target": BIG})   # a plan for a GPU with 1 MB per block
    assert hyp.derived["smem_bytes"] > H200["smem_per_block"]
    x, w1, w2 = torch.randn(64, 768).bfloat16(), torch.randn(3072, 768).bfloat16(), torch.randn(768, 3072).bfloat16()

    def no_route(*a, **k):
        raise AssertionError("a route (and with it code generation) was reached")
    monkeypatch.setattr(ops, "route_for", no_route)
    here = fuser.target.default_target()   # "h200" without a Hopper GPU, else the device's target
    here = re.escape(here if isinstance(here, str) else here["name"])
    with pytest.raises(ValueError, match=f"shared memory per block exceed {here}'s"):
        fuser.ffn(x, w1, w2, plan=hyp)


def test_ffn_checks_a_plan_for_the_tokens_of_the_call():
    p = fuser.plan(16, 1024, 4096, fused=True, kind="stream", bm=16, target="h200")
    w1, w2 = torch.randn(4096, 1024).bfloat16(), torch.randn(1024, 4096).bfloat16()
    assert fuser.ffn(torch.randn(16, 1024).bfloat16(), w1, w2, plan=p).shape == (16, 1024)
    assert fuser.ffn(torch.randn(0, 1024).bfloat16(), w1, w2, plan=p).shape == (0, 1024)
    assert fuser.ffn(torch.randn(17, 1024).bfloat16(), w1, w2, plan=p).shape == (17, 1024)  # two row tiles
    with pytest.raises(ValueError, match="2147483647 tokens in row tiles of 16 make more work units"):
        p.check("h200", m=2**31 - 1)


@pytest.mark.parametrize("path, value, exc, match", [
    (("params", "cluster"), [2**32 + 1, 8, 2, 4], ValueError, r"'cluster\[0\] \(cls_m\)' must be an int in \[1, 16\], got 4294967297"),
    (("params", "cluster"), [2**64, 1, 1, 1], ValueError, r"cls_m\)' must be an int in \[1, 16\], got one of more than 64 bits"),
    (("params", "cluster"), [0, 1, 1, 1], ValueError, r"cls_m\)' must be an int in \[1, 16\], got 0"),
    (("params", "cluster"), [1.5, 1, 1, 1], TypeError, r"cls_m\)' must be an int in \[1, 16\], got float"),
    (("params", "cluster"), [True, 8, 2, 4], TypeError, r"cls_m\)' must be an int .*got bool"),
    (("params", "cluster"), "1824", TypeError, "'cluster' must be a list or tuple of 4 values, got str"),
    (("params", "cluster"), [1, 8, 2], ValueError, "'cluster' must have 4 values, got 3"),
    (("params", "bn"), -16, ValueError, r"'bn' must be an int in \[32, 256\], got -16"),
    (("params", "bn"), 0, ValueError, r"'bn' must be an int in \[32, 256\], got 0"),
    (("params", "bn"), 2**32 + 128, ValueError, r"'bn' must be an int in \[32, 256\], got 4294967424"),
    (("params", "bn"), 128.0, TypeError, "'bn' must be an int .*got float"),
    (("params", "stages"), 0, ValueError, r"'stages' must be an int in \[1, 8\], got 0"),
    (("params", "n_iters"), 2**31, ValueError, r"'n_iters' must be an int in \[1, 4096\]"),
    (("params", "s1"), 4, ValueError, "a cluster plan has no stream splits"),
    (("params", "s2"), -1, ValueError, r"'s2' must be an int in \[0, 4096\], got -1"),
    (("chain", "m"), 2**70, ValueError, "'m' must be an int .*more than 64 bits"),
])
def test_integer_fields_are_range_checked_not_wrapped(path, value, exc, match):
    with pytest.raises(exc, match=match):
        fuser.Plan.from_dict(edited(base(), path, value))


@pytest.mark.parametrize("path, value, match", [
    (("chain", "activation"), "gelu\x00junk", "'activation' must not contain NUL characters"),
    (("chain", "dtype"), "bfloat16\x00", "'dtype' must not contain NUL characters"),
    (("params", "kind"), "cluster\x00stream", "'kind' must not contain NUL characters"),
    (("params", "order"), "n_outer\x00", "'order' must not contain NUL characters"),
    (("params", "gate_mode"), "none\x00", "'gate_mode' must not contain NUL characters"),
    (("params", "kind"), "Cluster", "'kind' must be one of 'cluster', 'stream', got 'Cluster'"),
    (("params", "order"), "sideways", "'order' must be one of 'n_outer', 'l_outer', got 'sideways'"),
    (("chain", "activation"), "gelu\ud800", "'activation' is not valid Unicode text"),
])
def test_strings_are_read_whole(path, value, match):
    with pytest.raises(ValueError, match=match):
        fuser.Plan.from_dict(edited(base(), path, value))


@pytest.mark.parametrize("key", ["fused", "gated", "bias_up", "bias_gate", "bias_down"])
@pytest.mark.parametrize("value", ["no", "false", "", 0, 1, None])
def test_bools_must_be_bools(key, value):
    path = (key,) if key == "fused" else ("chain", key)
    with pytest.raises(TypeError, match=f"'{key}' must be True or False, got {type(value).__name__}"):
        fuser.Plan.from_dict(edited(base(), path, value))
    # JSON's own booleans round-trip
    d = base()
    assert fuser.Plan.from_dict(json.loads(json.dumps(d))).to_dict() == fuser.Plan.from_dict(d).to_dict()


def test_stream_plans_kind_and_splits():
    d = stream()
    assert fuser.Plan.from_dict(d).kind == "stream"
    for s, v, match in (("s1", 0, r"'s1' must be an int in \[1, 4096\], got 0"),
                        ("s2", 2**32 + 1, r"'s2' must be an int in \[1, 4096\], got 4294967297"),
                        ("s1", "2", "'s1' must be an int"),
                        ("s2", 40, "leave a split empty")):
        with pytest.raises((TypeError, ValueError), match=match):
            fuser.Plan.from_dict(edited(d, ("params", s), v))
    with pytest.raises(ValueError, match="'kind' must be one of 'cluster', 'stream', got 'Stream'"):
        fuser.Plan.from_dict(edited(d, ("params", "kind"), "Stream"))


def test_runner_up_cycles_and_depth_are_refused():
    d = base()
    d["runner_up"] = d
    with pytest.raises(ValueError, match="refers back to itself .*cycle"):
        fuser.Plan.from_dict(d)
    a, b = base(), base()
    a["runner_up"], b["runner_up"] = b, a
    with pytest.raises(ValueError, match="cycle"):
        fuser.Plan.from_dict(a)
    deep = base()
    for _ in range(40):
        deep = dict(base(), runner_up=deep)
    with pytest.raises(ValueError, match="runner_up: nested more than 16 deep"):
        fuser.Plan.from_dict(deep)
    with pytest.raises(TypeError, match="runner_up: expected a plan dict or None, got list"):
        fuser.Plan.from_dict(dict(base(), runner_up=[1]))
    with pytest.raises(ValueError, match="runner_up: plan params: 'bn'"):
        fuser.Plan.from_dict(dict(base(), runner_up=edited(base(), ("params", "bn"), 0)))


def test_a_dict_without_a_target_explains_itself():
    d = base()
    del d["target"], d["search"]
    p = fuser.Plan.from_dict(d)
    assert p.target["name"] == "h200" or p.target == fuser.target.default_target()
    assert "FFN: 64 tokens" in p.explain()


@pytest.mark.parametrize("stats, exc", [
    ([1, 2], TypeError), ({"candidates": "many"}, TypeError), ({"search_ms": float("nan")}, ValueError),
    ({"scored": -1}, ValueError), ({"pruned": {"rule": "x"}}, TypeError),
])
def test_search_stats_are_checked(stats, exc):
    with pytest.raises(exc, match="search"):
        fuser.Plan.from_dict(dict(base(), search=stats))


@pytest.mark.parametrize("kw, exc, match", [
    (dict(bn=-16), ValueError, r"'bn' must be an int in \[32, 256\], got -16"),
    (dict(bn=0), ValueError, r"'bn' must be an int in \[32, 256\], got 0"),
    (dict(stages=0), ValueError, r"'stages' must be an int in \[1, 8\], got 0"),
    (dict(s1=0), ValueError, r"'s1' must be an int in \[1, 4096\], got 0"),
    (dict(cluster=(0, 1, 1, 1)), ValueError, r"'cls_m' must be an int in \[1, 16\], got 0"),
    (dict(cluster=(1.5, 1, 1, 1)), TypeError, "'cls_m' must be an int .*got float"),
    (dict(cluster=(2**32 + 2, 8, 1, 1)), ValueError, r"'cls_m' must be an int in \[1, 16\], got 4294967298"),
    (dict(cluster=5), TypeError, "cluster: expected"),
    (dict(bm=2**63), ValueError, "'bm' must be an int .*more than 64 bits"),
    (dict(m=2**63), ValueError, "'m' must be an int .*more than 64 bits"),
    (dict(d_model=2**64), ValueError, "'d_model' must be an int .*more than 64 bits"),
    (dict(k=2**63), ValueError, r"'k' must be an int in \[1, 64\]"),
    (dict(k=2.0), TypeError, "'k' must be an int"),
    (dict(activation="relu\x00junk"), ValueError, "'activation' must not contain NUL"),
    (dict(kind="stream\x00"), ValueError, "'kind' must not contain NUL"),
    (dict(order="n_outer\x00x"), ValueError, "'order' must not contain NUL"),
    (dict(target="h200\x00x"), ValueError, "target: 'name' must not contain NUL"),
    (dict(target=dict(H200, name="x" * 64)), ValueError, "'name' must be at most 63 bytes"),
    (dict(target=dict(H200, usable_sms=[2**32 + 132] * 5)), ValueError, "'usable_sms' must be an int"),
    (dict(target=dict(H200, usable_sms=range(5))), TypeError, "'usable_sms' must be a list or tuple"),
    (dict(target=dict(H200, hbm_gbs=float("inf"))), ValueError, "'hbm_gbs' must be a finite number, got inf$"),
    (dict(target=dict(H200, hbm_gbs=10**400)), ValueError, "'hbm_gbs' must be a finite number, got inf$"),
    (dict(target=dict(H200, hbm_gbs="fast")), TypeError, "'hbm_gbs' must be a number, got str"),
    (dict(target=dict(H200, hbm_gbz=4000.0)), ValueError, "target: unknown field 'hbm_gbz'"),
    (dict(target={1: 2}), ValueError, "target: unknown field 1"),
    (dict(fused="no"), TypeError, "fused: expected True, False or None, got str"),
    (dict(gated="no"), TypeError, "gated: expected True or False, got str"),
    (dict(gated=1), TypeError, "gated: expected True or False, got int"),
    (dict(bias=5), TypeError, "bias: expected True/False or names"),
    (dict(bias=[["up"]]), TypeError, "bias: expected True/False or names"),
    (dict(dataflows=5), TypeError, "dataflows: expected dataflow names, got int"),
    (dict(avoid=[["shuffle"]]), ValueError, "avoid: unknown dataflow"),
])
def test_plan_arguments_are_checked_exactly(kw, exc, match):
    args = dict(m=64, d_model=768, d_ff=3072, target="h200")
    args.update(kw)
    m, d, f = args.pop("m"), args.pop("d_model"), args.pop("d_ff")
    with pytest.raises(exc, match=match):
        (fuser.plans if "k" in args else fuser.plan)(m, d, f, **args)

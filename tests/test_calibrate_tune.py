"""Calibration and tuning without a GPU: the per-GPU store (atomic, corrupt files ignored with a
warning), the planner's target picking up a calibration file, ``fuser.tune`` keeping the fastest of the
candidates a timer reports and the runtime's plan lookup returning it, and the clear refusals where no
Hopper GPU is present. The measurements themselves run on the GPU (tests/test_gpu_kernels.py)."""
import json
import subprocess
import sys

import pytest

import fuser
from fuser import calibrate, runtime, store, tuning
from fuser.bench import hopper_reason

no_hopper = pytest.mark.skipif(hopper_reason() is None, reason="checks the refusal shown without a Hopper GPU")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSER_CACHE_DIR", str(tmp_path))
    calibrate.forget()
    tuning.forget()
    yield tmp_path
    calibrate.forget()
    tuning.forget()


def test_store_round_trip_and_corrupt_file(cache):
    assert store.device_key("NVIDIA H200 NVL", 132) == "NVIDIA-H200-NVL-132sm"
    assert store.load("calibration", "x") == {}
    p = store.save("calibration", "x", {"fields": {"launch_us": 3.0}})
    assert p.startswith(str(cache)) and store.load("calibration", "x") == {"fields": {"launch_us": 3.0}}
    assert [f.name for f in (cache / "calibration").iterdir()] == ["x.json"]      # no temporary left
    (cache / "calibration" / "y.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring .*y.json"):
        assert store.load("calibration", "y") == {}


def test_calibration_file_feeds_the_target(cache):
    t = fuser._C.targets()["h200"]
    store.save("calibration", store.device_key("Fake H200", 132),
               {"fields": {"launch_us": 4.0, "fused_time_scale": 1.5, "clock_ghz": 9.9, "hbm_gbs": "fast"}})
    got = calibrate.apply(t, "Fake H200", 132)
    assert got["launch_us"] == 4.0 and got["fused_time_scale"] == 1.5
    assert got["clock_ghz"] == t["clock_ghz"] and got["hbm_gbs"] == t["hbm_gbs"]   # not MEASURED / not a number
    assert calibrate.apply(t, "Another GPU", 132) == t
    # the planner honours the fields: a lower fused scale predicts the fused plan faster
    base = fuser.plan(128, 768, 3072, activation="gelu", fused=True, target=t)
    cal = fuser.plan(128, 768, 3072, activation="gelu", fused=True, target=got)
    assert cal.predicted_us < base.predicted_us


@no_hopper
def test_calibrate_and_tune_refuse_without_hopper():
    r = subprocess.run([sys.executable, "-m", "fuser", "calibrate"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "fuser calibrate measures a Hopper GPU (sm_90): " + hopper_reason() in r.stderr
    with pytest.raises(RuntimeError, match="fuser.tune times plans on a Hopper GPU"):
        fuser.tune(16, 768, 3072, activation="gelu")


def test_tune_keeps_the_fastest_and_the_runtime_uses_it(cache, monkeypatch):
    monkeypatch.setattr(tuning, "_device_identity", lambda: ("Fake H200", 132))
    seen = {}

    def timer(w, plans):
        seen["w"], seen["plans"] = w, plans
        t = [100.0 + i for i in range(len(plans))]
        t[2] = 50.0            # the third-best predicted fused plan is the fastest measured
        t[1] = None            # one failed to run
        return t
    r = fuser.tune(128, 768, 3072, activation="gelu", k=4, timer=timer)
    plans = seen["plans"]
    assert len(plans) == 5 and [p.fused for p in plans] == [True] * 4 + [False]
    assert (seen["w"].m, seen["w"].d_model, seen["w"].d_ff, seen["w"].activation) == (128, 768, 3072, "gelu")
    assert r.best == plans[2] and r.timings[0][2] == 50.0 and r.timings[-1][2] is None
    assert "failed" in r.table() and r.table().count("\n") == 5
    stored = json.loads((cache / "tuned" / "Fake-H200-132sm.json").read_text())
    chain = plans[2].chain
    assert list(stored["plans"]) == [tuning.chain_key(chain)]
    assert tuning.lookup(chain, "Fake H200", 132) == plans[2]
    assert tuning.lookup(dict(chain, m=129), "Fake H200", 132) is None
    assert tuning.lookup(chain, "Other GPU", 132) is None
    # the runtime's plan for that exact chain on a device of that model is the tuned one
    monkeypatch.setitem(runtime._gpu, 7, ("Fake H200", 132))
    monkeypatch.setitem(runtime._env_ok, 7, (True, ""))
    runtime.forget_plans()
    try:
        assert runtime.plan_for(chain, 7) == plans[2]
    finally:
        runtime.forget_plans()


def test_tune_needs_a_timing():
    with pytest.raises(RuntimeError, match="no candidate could be timed"):
        fuser.tune(128, 768, 3072, activation="gelu", k=2, timer=lambda w, plans: [None] * len(plans))

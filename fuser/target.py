"""The GPU target the planner plans for, with what was measured on this GPU model laid over it.

``default_target()`` is this machine's Hopper GPU (its built-in table) or, without one, the H200
defaults. Two per-GPU files in the kernel cache directory (``fuser.store``) are read here and never
written: ``calibration/<gpu>.json``, the constants ``python -m fuser calibrate`` measured (``apply``
lays them over the table), and ``tuned/<gpu>.json``, the plans ``fuser.tune`` timed fastest, one per
exact chain (``tuned_plan``). The measuring lives in ``fuser.tools.calibrate`` and
``fuser.tools.tuning``; after writing a file they call ``forget()`` so the next read sees it.
"""
from __future__ import annotations

import math
import warnings

from fuser import _C, store
from fuser._env import env

__all__ = ["MEASURED", "FRACTIONS", "default_target", "apply", "chain_key", "tuned_plan", "forget"]

#: The target fields ``python -m fuser calibrate`` measures (and the only ones a calibration file sets).
MEASURED = ("hbm_gbs", "mma_tflops", "small_gemm_eff", "launch_us", "dsm_bytes_per_clk", "barrier_cycles",
            "fused_mma_eff", "fused_time_scale", "fused_scale_compute", "fused_scale_hbm", "fused_scale_l2",
            "fused_scale_dsm", "fused_scale_smem", "fused_scale_sync", "fused_scale_tail", "stream_mma_eff")
#: Fields that are at most 1 (efficiencies).
FRACTIONS = ("small_gemm_eff", "fused_mma_eff", "stream_mma_eff")

_calibration = {}   # device key -> stored fields
_tuned = {}         # device key -> {chain key: plan dict}


def default_target():
    """The target to plan for: this machine's Hopper GPU when there is one (its built-in table, with what
    ``python -m fuser calibrate`` measured on this GPU model, if it ran), else ``"h200"``.

    Example:
        >>> import fuser
        >>> from fuser.target import default_target
        >>> t = default_target()
        >>> t == "h200" or t["name"] != ""
        True
    """
    e = env()
    if not e.gpu_name or e.compute_capability != (9, 0):
        return "h200"
    raw = _C.env(device=e.device)
    t = _C.target_for_device(raw["gpu_name"], tuple(raw["compute_capability"]), raw["sm_count"],
                             raw["smem_per_block_optin"], raw["smem_per_sm"], raw["l2_bytes"],
                             raw["clock_khz"], raw["mem_clock_khz"], raw["mem_bus_bits"])
    return apply(t, raw["gpu_name"], raw["sm_count"])


def _usable(key, value, current):
    """Whether a stored calibration value can replace the target's `current` one: a positive finite
    number (at most 1 for an efficiency), or for a per-cluster-size list a list of as many numbers, each
    positive (the cluster-size-1 slot, unused, may be 0)."""
    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if isinstance(current, list):
        return (isinstance(value, list) and len(value) == len(current) and all(num(v) for v in value)
                and value[0] >= 0 and all(v > 0 for v in value[1:]))
    return num(value) and value > 0 and (key not in FRACTIONS or value <= 1)


def apply(target, gpu_name, sm_count):
    """`target` (a target dict) with the fields this GPU model's calibration file measured. A field
    whose stored value is unusable (not a positive number, a list of the wrong length) keeps the
    target's value, with a warning naming it.

    Example:
        >>> import fuser
        >>> from fuser.target import apply
        >>> t = fuser._C.targets()["h200"]
        >>> apply(t, "a GPU never calibrated", 1) == t
        True
    """
    key = store.device_key(gpu_name, sm_count)
    if key not in _calibration:
        _calibration[key] = store.load("calibration", key).get("fields", {})
    out = dict(target)
    bad = []
    for k, v in _calibration[key].items():
        if k not in MEASURED or k not in out:
            continue
        if _usable(k, v, out[k]):
            out[k] = [float(x) for x in v] if isinstance(v, list) else float(v)
        else:
            bad.append(f"{k}={v!r}")
    if bad:
        warnings.warn(f"fuser: calibration of {key}: ignoring unusable {', '.join(bad)} (run `python -m fuser "
                      "calibrate` again)", RuntimeWarning, stacklevel=2)
    if out["hbm_gbs"] != target["hbm_gbs"]:
        # the stream's rates keep their ratio to the measured bandwidth (equal on an H200, above it on an H100)
        for k in ("stream_hbm_gbs", "stream_long_gbs"):
            out[k] = target[k] * out["hbm_gbs"] / target["hbm_gbs"]
    return out


def chain_key(chain):
    """The key of a chain dict (as ``_C.ffn_check`` or ``Plan.chain`` give it) in the tuned-plan file.

    Example:
        >>> from fuser.target import chain_key
        >>> chain_key(dict(m=16, d_model=4096, d_ff=14336, d_out=4096, gated=True, activation="silu",
        ...                bias_up=False, bias_gate=False, bias_down=False, dtype="bfloat16"))
        'm=16 k=4096 n=14336 l=4096 gated silu bias=- bfloat16'
    """
    bias = "".join(c for c, f in (("u", "bias_up"), ("g", "bias_gate"), ("d", "bias_down")) if chain[f]) or "-"
    return (f"m={chain['m']} k={chain['d_model']} n={chain['d_ff']} l={chain['d_out']} "
            f"{'gated' if chain['gated'] else 'plain'} {chain['activation']} bias={bias} {chain['dtype']}")


def tuned_plan(chain, gpu_name, sm_count):
    """The plan dict ``fuser.tune`` stored for this exact chain on this GPU model (``Plan.to_dict()``
    output), or None.

    Example:
        >>> import fuser
        >>> from fuser.target import tuned_plan
        >>> tuned_plan(fuser.plan(16, 768, 3072).chain, "a GPU never tuned", 1) is None
        True
    """
    key = store.device_key(gpu_name, sm_count)
    if key not in _tuned:
        _tuned[key] = dict(store.load("tuned", key).get("plans", {}))
    return _tuned[key].get(chain_key(chain))


def forget():
    """Drop the in-memory copies of the calibration and tuned-plan files (after writing one, or in tests).

    Example:
        >>> from fuser import target
        >>> target.forget()
    """
    _calibration.clear()
    _tuned.clear()

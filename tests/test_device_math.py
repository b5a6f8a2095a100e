"""The device code's own math, checked on the CPU: the exact-GELU polynomial of
include/fuser/device/common.cuh (``gelu_erf``), read from the header and evaluated as the GPU does in
fp32 (each fma rounded once, ex2 correctly rounded), against float64 GELU; and GELU's tanh form
(``gelu_tanh``, its constants read from the header) against float64. The GPU correctness matrices check
the same functions inside the kernels."""
import math
import os
import re

import numpy as np
import pytest

HEADER = os.path.join(os.path.dirname(__file__), "..", "include", "fuser", "device", "common.cuh")


def coefficients():
    src = open(HEADER).read()
    body = re.search(r"GELU_Q\[9\]\s*=\s*\{([^}]*)\}", src)
    assert body, "GELU_Q not found in common.cuh"
    q = [np.float32(float(v.strip().rstrip("f"))) for v in body.group(1).split(",")]
    assert len(q) == 9
    return q


def f32(v):
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def gelu_device(x):
    """gelu_erf as compiled: fp32 values, fmaf rounded once (exact in float64 for fp32 inputs), ex2 with
    results below 2^-126 flushed to zero, max.NaN keeping NaN."""
    q = coefficients()
    x = f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        z = f32(np.abs(x).astype(np.float64) * np.float64(np.float32(0.70710678118654752)))
        zq, zt = np.minimum(z, np.float32(4)), np.fmin(z, np.float32(20))
        acc = np.full_like(zq, q[8])
        for c in q[7::-1]:
            acc = f32(acc.astype(np.float64) * zq + np.float64(c))
        e = f32(np.exp2(f32(-zt.astype(np.float64) * acc - 0.5).astype(np.float64)))
        e = np.where(e < np.float32(2.0 ** -126), np.float32(0), e)
        relu = np.where(np.isnan(x), x, np.maximum(x, np.float32(0)))
        return f32(-zt.astype(np.float64) * e + relu)


def gelu_exact(x):
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in np.asarray(x, dtype=np.float64)])


XS = np.concatenate([np.linspace(-8, 8, 160001), -np.logspace(-8, 1, 2001), np.logspace(-8, 1, 2001)])


def check_against(device, exact, rel_bound):
    """`device` on XS within `rel_bound` relative error wherever |GELU| > 1e-6, and 1e-6 absolute."""
    x = f32(XS).astype(np.float64)
    got, ref = device(x).astype(np.float64), exact(x)
    big = np.abs(ref) > 1e-6
    rel = np.abs(got[big] / ref[big] - 1)
    assert rel.max() < rel_bound, (rel.max(), x[big][rel.argmax()])
    assert np.abs(got - ref).max() < 1e-6


def test_gelu_matches_float64_to_a_few_fp32_ulps():
    # 5e-6 of the fit plus ex2.approx's 2 ulps (2.4e-7): far below a bfloat16 or float16 rounding step
    check_against(gelu_device, gelu_exact, 6e-6)


def test_gelu_tails_and_special_values():
    got = gelu_device([0.0, -0.0, 5.66, 100.0, -5.66, -100.0, 3e38, np.inf, np.nan, -np.inf, -28.3])
    assert got[0] == 0 and got[1] == 0
    assert got[2] == np.float32(5.66) and got[3] == 100 and got[6] == np.float32(3e38) and got[7] == np.inf
    assert np.isnan(got[8])
    assert got[5] == 0 and got[9] == 0       # past z = 20 the power flushes to zero
    # past z = 4 the fit is held at q(4): the tail stays below 5e-8, far under a 16-bit step at any scale
    tail = f32(-np.linspace(5.66, 28.3, 2001))
    assert np.all(np.abs(gelu_device(tail)) < 5e-8) and np.all(gelu_device(tail) <= 0)
    assert abs(float(got[4])) < 5e-8 and abs(float(got[10])) < 5e-8


@pytest.mark.parametrize("x", [-5.0, -4.5, -4.0, -3.5])
def test_gelu_negative_tail_has_no_cancellation(x):
    """0.5 x (1 + erf(x / sqrt 2)) in fp32 loses digits where erf is near -1; erfc in one piece does not."""
    ref = gelu_exact([x])[0]
    ours = float(gelu_device([x])[0])
    erf_form = float(np.float32(0.5) * np.float32(x) * (np.float32(1) + np.float32(math.erf(np.float32(x) * np.float32(0.70710678)))))
    assert abs(ours / ref - 1) < 6e-6
    assert abs(erf_form / ref - 1) > 10 * abs(ours / ref - 1)


def tanh_constants():
    src = open(HEADER).read()
    k1 = re.search(r"GELU_TANH_K1\s*=\s*-2\.0f \* ([0-9.]+)f \* ([0-9.]+)f;", src)
    k3 = re.search(r"GELU_TANH_K3\s*=\s*GELU_TANH_K1 \* ([0-9.]+)f;", src)
    assert k1 and k3, "GELU_TANH_K1 / K3 not found in common.cuh"
    c1 = np.float32(-2.0 * float(np.float32(k1.group(1))) * float(np.float32(k1.group(2))))
    return c1, np.float32(float(c1) * float(np.float32(k3.group(1))))


def gelu_tanh_device(x):
    """gelu_tanh as compiled: x / (1 + ex2(x (k3 x^2 + k1))) in fp32 (rcp and ex2 correctly rounded)."""
    k1, k3 = tanh_constants()
    x = f32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        x2 = f32(x.astype(np.float64) ** 2)
        t = f32(x.astype(np.float64) * f32(x2.astype(np.float64) * np.float64(k3) + np.float64(k1)))
        e = f32(np.exp2(t.astype(np.float64)))
        r = f32(1.0 / f32(1.0 + e.astype(np.float64)).astype(np.float64))
        return f32(x.astype(np.float64) * r)


def gelu_tanh_exact(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_gelu_tanh_matches_float64():
    check_against(gelu_tanh_device, gelu_tanh_exact, 1e-5)
    # where 1 + tanh(u) cancels in fp32 (u < -3), the sigmoid form keeps its digits
    tail = f32(-np.linspace(3.0, 6.0, 301)).astype(np.float64)
    fp32_tanh = f32(0.5 * tail * (1 + f32(np.tanh(f32(math.sqrt(2 / math.pi) * (tail + 0.044715 * tail ** 3))))))
    ref_t = gelu_tanh_exact(tail)
    assert np.abs(gelu_tanh_device(tail) / ref_t - 1).max() < 1e-5 < np.abs(fp32_tanh / ref_t - 1).max()


def test_gelu_tanh_special_values():
    got = gelu_tanh_device([0.0, 100.0, -100.0, np.inf, np.nan])
    assert got[0] == 0 and got[1] == 100 and got[2] == 0 and got[3] == np.inf and np.isnan(got[4])

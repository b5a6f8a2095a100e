"""Every kernel variant the GPU correctness matrix runs (tests/gpu/matrix.py: every dataflow x gated mode
x activation x bias x dtype over its shapes) compiles through NVRTC for sm_90a here, on a CPU-only
machine: zero spill bytes, no stack frame, shared memory within the H200's per-block limit, and no
CUDA math slow-path subroutine. Needs NVRTC (the nvidia-cuda-nvrtc wheel CI installs)."""
import concurrent.futures
import os
import sys

import pytest

import fuser
from fuser import runtime

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))
import matrix  # noqa: E402

SMEM_LIMIT = 232448


def test_every_matrix_variant_compiles_clean():
    if not fuser.env().nvrtc_found:
        pytest.skip("needs NVRTC (pip install nvidia-cuda-nvrtc)")
    plans = {}
    for c in matrix.cases():
        p, _, _ = matrix.find_plan(c)
        assert p is not None, c
        plans.setdefault(fuser._C.codegen(p._d, p.target), p)
    assert len(plans) > 150
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        kernels = list(ex.map(runtime.compile, plans.values()))
    for k in kernels:
        what = k.plan.summary()
        assert k.spill_bytes == 0, what
        assert "0 bytes stack frame" in k.log, what
        assert k.shared_bytes <= SMEM_LIMIT, what
        assert not any(tag in k.cubin for tag in runtime.MATH_SUBROUTINES), what
    seen = {df for k in kernels for df in k.plan.dataflows} | {k.plan.gate_mode for k in kernels}
    assert seen >= set(fuser.DATAFLOWS) | {"none", "spatial", "sequential"}

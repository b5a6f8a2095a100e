"""The calibration probes (include/fuser/device/probes.cuh, fuser/probes.py): they compile for sm_90a on
a CPU-only machine with every kernel present and nothing spilled, and on a Hopper GPU (marked gpu) they
measure DSM bandwidth per cluster size, the cluster barrier and the main loop's tensor-core rate within
physical bounds, check that each block read its own peer, and refuse bad launches with an exception
that leaves the GPU usable."""
import math

import pytest

import fuser
from fuser.tools import probes


def test_probes_compile_clean():
    if not fuser.env().nvrtc_found:
        pytest.skip("needs NVRTC (pip install nvidia-cuda-nvrtc)")
    k = probes.compiled()
    names = {d["name"] for d in k.kernels}
    assert names == {"fuser_probe_dsm", "fuser_probe_barrier"} | {f"fuser_probe_mma_{m}x{n}" for m, n in probes.MMA_TILES}
    assert k.spill_bytes == 0 and "0 bytes stack frame" in k.log
    # one block of 256 threads per SM: the biggest tile keeps its accumulators in registers
    assert all(d["registers"] <= 255 for d in k.kernels)


# ---- on a Hopper GPU ----

def _matmul_tflops():
    from fuser.tools.bench import measure_ceilings
    return measure_ceilings()["matmul_tflops"]


@pytest.mark.gpu
def test_dsm_probe_reads_the_peer_at_a_plausible_rate():
    for c in probes.CLUSTERS:
        r = probes.dsm(c)        # raises if a block read anything but block (rank + 1) of its cluster
        # remote reads run well below local shared memory (~128 B/clk/SM) and above a trickle
        assert 4 < r["bytes_per_clk"] < 64, r
        assert r["blocks"] % c == 0 and r["blocks"] >= 100, r
        assert 0.8 < r["clock_ghz"] < 2.2, r


@pytest.mark.gpu
def test_barrier_probe_counts_cycles_per_barrier():
    rs = [probes.barrier(c, t) for t in (128, 384) for c in (1, 2, 16)]
    assert all(50 < r["cycles"] < 5000 for r in rs), rs
    # twice the iterations, the same cost per barrier (the loop, not the launch, is measured)
    a, b = probes.barrier(4, 256, iters=1000), probes.barrier(4, 256, iters=2000)
    assert abs(a["cycles"] / b["cycles"] - 1) < 0.15, (a, b)


@pytest.mark.gpu
def test_mma_probe_rate_is_below_the_matmul_rate():
    peak = _matmul_tflops()
    rs = [probes.mma(m, n) for m, n in probes.MMA_TILES]
    for r in rs:
        assert 0.05 * peak < r["tflops"] < 1.1 * peak, (r, peak)
    # clocks agree with events: FLOP per clock per SM x SMs x clock = the event rate
    import torch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    r = rs[-1]
    assert math.isclose(r["flop_per_clk_sm"] * sms * r["clock_ghz"] / 1e3, r["tflops"], rel_tol=0.15), r


@pytest.mark.gpu
def test_bad_probe_launches_raise_and_leave_the_gpu_usable():
    import torch

    from fuser import _C
    k = probes._kernel("fuser_probe_barrier")
    s = torch.cuda.current_stream().cuda_stream
    out = torch.zeros(8, device="cuda")
    with pytest.raises(ValueError, match="at least 2 x grid = 16 elements"):
        _C.probe_launch(k, 8, 128, 1, 0, out, 1, s)                  # out too small for the grid
    with pytest.raises(ValueError, match="float32 tensor"):
        _C.probe_launch(k, 2, 128, 1, 0, torch.zeros(8, device="cuda", dtype=torch.bfloat16), 1, s)
    with pytest.raises(ValueError, match="float32 tensor"):
        _C.probe_launch(k, 2, 128, 1, 0, torch.zeros(8), 1, s)       # on the CPU
    with pytest.raises(ValueError, match="iters"):
        _C.probe_launch(k, 2, 128, 1, 0, out, -1, s)
    with pytest.raises(ValueError, match="not a whole number of clusters"):
        _C.probe_launch(k, 3, 128, 2, 0, out, 1, s)
    with pytest.raises(ValueError, match="more than 1024 threads"):
        _C.probe_launch(k, 2, 2048, 1, 0, out, 1, s)
    with pytest.raises(fuser.CudaError):
        _C.probe_launch(k, 32, 128, 32, 0, torch.zeros(64, device="cuda"), 1, s)   # cluster above 16
    with pytest.raises(TypeError, match="probe_load"):
        _C.probe_launch(object(), 2, 128, 1, 0, out, 1, s)
    with pytest.raises(fuser.CudaError, match="no_such_kernel|CUDA_ERROR"):
        _C.probe_load(probes.compiled().cubin, "no_such_kernel", 0)
    torch.cuda.synchronize()
    assert probes.barrier(2, 128, iters=100)["cycles"] > 0        # the GPU still runs

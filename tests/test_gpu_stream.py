"""The stream kernel and the wgmma GEMM probe on a Hopper GPU (marked gpu; skipped with a reason
elsewhere): the stream correctness matrix (tests/gpu/stream_matrix.py), one plan reused across token
counts, within one row tile and over several (its sync words return to zero after every launch), both
unit orders of row tiles, CUDA graph capture and replay, early (programmatic dependent) launches back to
back on one scratch, the unit trace, and the GEMM probe against torch."""
import json
import os
import sys

import pytest
import torch

import fuser
from fuser import _C, runtime
from fuser.tools import probes
from conftest import rel_error

pytestmark = pytest.mark.gpu
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))
from plan_check import ffn_tensors, graph_of  # noqa: E402


def tensors(m, d, f, l, gated, seed):
    return ffn_tensors(torch.Generator(device="cuda").manual_seed(seed), m, d, f, l, gated=gated, bias=False,
                       dtype=torch.bfloat16)


def test_stream_correctness_matrix():
    import stream_matrix
    summary, results = stream_matrix.run(log=lambda s: None)
    path = os.environ.get("FUSER_GPU_STREAM_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(summary=summary, results=results), f, indent=1)
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad[:5]


def test_exact_token_boxes_give_the_whole_boxes_bits():
    """Every ragged case of the stream matrix with its last row tile's token boxes exact (X's through its own
    map, H read as whole row tiles of the padded scratch) passes the matrix's checks and gives the bits of
    whole boxes (TMA's zero fill past the last row)."""
    import stream_matrix
    summary, results = stream_matrix.run(log=lambda s: None, exact=True)
    assert summary["cases"] >= 40, summary
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad[:5]


def test_every_first_pass_lead_gives_the_same_bits():
    """Every case of the stream matrix with the ring's first pass requested whole, a slot at a time and in the
    default lead (``_C.stream_lead_bytes``) passes the matrix's checks with the same bits each time. In a child
    process with a timeout, so a producer waiting for a slot that no load fills fails the test (the child's end
    frees the GPU)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "leads.json")
        try:
            r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "gpu", "stream_matrix.py"),
                                "--leads", "--json", path], capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the matrix did not end in 900 s (a first-pass wait for a slot never filled?): {e.stdout!r}")
        assert r.returncode == 0 or os.path.exists(path), r.stderr[-2000:]
        with open(path) as f:
            out = json.load(f)
    assert out["summary"]["cases"] >= 80, out["summary"]
    bad = [x for x in out["results"] if not x["ok"]]
    assert not bad, bad[:5]
    assert all(x["same_bits"] and len(x["each_ok"]) == 3 for x in out["results"])


def test_exact_token_boxes_follow_a_prepared_launch_and_a_graph():
    """Exact token boxes in a launch prepared once and run at another x's address (the tail map re-encoded)
    and in a CUDA graph replayed over new x values: each output is the bits of a plain launch with whole
    boxes; the setting is read when a launch is prepared, so switching it later leaves both as made."""
    m, d, f, l = 77, 1024, 4096, 1024
    p = fuser.plan(m, d, f, gated=True, activation="silu", target="h200", fused=True, kind="stream", bm=128,
                   s1=1, s2=2)
    dev, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, dev)
    buf = launch.scratch(m, stream)
    a, b = tensors(m, d, f, l, True, 21), tensors(m, d, f, l, True, 22)

    def whole(x):
        y = torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16)
        _C.ffn_launch(launch.kernel, x, a["w_up"], a["w_down"], a["w_gate"], None, None, None, "silu", y,
                      buf.capsule, stream)
        return y

    y0 = torch.empty(m, l, device="cuda", dtype=torch.bfloat16)
    before = _C.stream_exact_boxes(True)
    try:
        kept = _C.ffn_prepare(launch.kernel, a["x"], a["w_up"], a["w_down"], a["w_gate"], None, None, None, "silu",
                              y0, buf.capsule, stream, keep=False)
        out = torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16)
        x = a["x"].clone()
        g = graph_of([lambda: fuser.ffn(x, a["w_up"], a["w_down"], w_gate=a["w_gate"], activation="silu", out=out,
                                        plan=p)])
    finally:
        _C.stream_exact_boxes(before)
    assert _C.stream_exact_boxes() == before
    ya = torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16)
    xb = b["x"].clone()
    _C.ffn_run(kept, xb.data_ptr(), ya.data_ptr(), a["w_up"].data_ptr(), a["w_down"].data_ptr(),
               a["w_gate"].data_ptr(), None, None, None)
    torch.cuda.synchronize()
    assert torch.equal(ya, whole(b["x"]))
    for seed in (1, 2):
        x.copy_(torch.randn(m, d, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, whole(x)), seed
    ref = fuser.ffn_reference(x, a["w_up"], a["w_down"], w_gate=a["w_gate"], activation="silu",
                              compute_dtype=torch.float64)
    assert rel_error(out, ref) < 1.5e-2


def test_one_stream_plan_serves_every_token_count():
    """bm = 64: 1, 64, 33, 7 tokens (one row tile) and 200, 129 (four and three) in a row on one kernel;
    each launch leaves the tickets, ready counters and claim counter at zero for the next (a stale counter
    would hang or skip units)."""
    p = fuser.plan(64, 1024, 4096, gated=True, activation="silu", target="h200", fused=True, kind="stream",
                   bm=64, s1=3, s2=4)
    for m in (1, 64, 33, 200, 7, 129, 64):
        t = tensors(m, 1024, 4096, 1024, True, m)
        out = torch.full((m, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
        fuser.ffn(activation="silu", out=out, plan=p, **t)
        ref = fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **t)
        assert rel_error(out, ref) < 1.5e-2, m


def test_stream_plan_in_a_cuda_graph():
    p = fuser.plan(16, 768, 3072, activation="gelu", target="h200", fused=True, kind="stream", bm=16, s1=2, s2=4)
    t = tensors(16, 768, 3072, 768, False, 1)
    out = torch.empty(16, 768, device="cuda", dtype=torch.bfloat16)
    fuser.ffn(activation="gelu", out=out, plan=p, **t)       # warm: compile, load, scratch
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        fuser.ffn(activation="gelu", out=out, plan=p, **t)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        out.fill_(float("nan"))
        t["x"].copy_(torch.randn_like(t["x"]))
        g.replay()
        ref = fuser.ffn_reference(activation="gelu", compute_dtype=torch.float64, **t)
        assert rel_error(out, ref) < 1.5e-2


@pytest.mark.parametrize("l", [512, 384])
def test_a_fused_routes_output_is_allocated_row_major_in_xs_shape(l):
    """A fused route allocates y itself: x's shape (empty_like(x), the cheapest allocation, where d_out is
    d_model) or [..., d_out]; row-major, every element written (the reference in float64 agrees), through
    fuser.ffn and on the route's later calls (its prepared launch re-pointed at a new x and y)."""
    from fuser.route import route_for
    p = fuser.plan(96, 512, 1024, d_out=l, activation="relu", target="h200", fused=True, kind="stream", bm=64)
    t = tensors(96, 512, 1024, l, False, 3)
    t["x"] = t["x"].view(2, 48, 512)
    r = route_for(_C.ffn_check(*(t[k] for k in ("x", "w_up", "w_down"))), p)
    assert r.fused
    for call in range(3):
        args = [t.get(k) for k in ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")]
        y = fuser.ffn(activation="relu", plan=p, **t) if call == 0 else r.run(*args, "relu")
        ref = fuser.ffn_reference(activation="relu", compute_dtype=torch.float64, **t)
        assert y.shape == (2, 48, l) and y.is_contiguous() and y.dtype == torch.bfloat16
        assert rel_error(y, ref) < 1.5e-2
        t["x"] = torch.randn_like(t["x"])
    assert len(r.prepared) == 1


@pytest.mark.parametrize("d,f,m", [(1024, 2048, 300), (4096, 4096, 300)])
def test_row_tiles_in_either_unit_order(d, f, m):
    """Three row tiles of 128 (the last partial) with weights that stay in L2 (13 MB: row tile by row tile)
    and with weights that do not (100 MB: every row tile of a weight tile in a row), each against float64."""
    p = fuser.plan(m, d, f, gated=True, activation="silu", target="h200", fused=True, kind="stream", bm=128,
                   s1=1, s2=2)
    assert p.derived["grid_m"] == 3
    t = tensors(m, d, f, d, True, 7)
    out = torch.full((m, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    fuser.ffn(activation="silu", out=out, plan=p, **t)
    ref = fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **t)
    assert rel_error(out, ref) < 1.5e-2


@pytest.mark.parametrize("bm,s1,s2,m,cluster", [(16, 2, 4, 13, (1, 1, 1, 1)), (64, 3, 2, 13, (1, 1, 1, 1)),
                                                 (64, 1, 2, 150, (1, 1, 1, 1)), (64, 1, 2, 150, (2, 1, 1, 1)),
                                                 (16, 2, 4, 13, (1, 2, 1, 2)), (16, 1, 8, 40, "one phase")])
def test_back_to_back_early_launches_share_a_scratch_safely(bm, s1, s2, m, cluster):
    """Stream kernels start early (programmatic dependent launch) while the previous one on the stream
    finishes. Eight launches back to back in a graph, on one scratch (split partials, H, tickets, ready and
    claim counters), alternating four input sets: every output matches float64, and is bitwise what the
    same launches give when each waits for the previous one to end. Cluster pairs too (their claims go
    through the pair's hand-off box; three row tiles leave a ghost)."""
    d, f = 1024, 4096
    shape = dict(phases=1) if cluster == "one phase" else dict(cluster=cluster)
    p = fuser.plan(m, d, f, gated=True, activation="silu", target="h200", fused=True, kind="stream", bm=bm,
                   s1=s1, s2=s2, **shape)
    dev, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, dev)
    buf = launch.scratch(m, stream)
    ins = [tensors(m, d, f, d, True, 40 + i) for i in range(4)]
    outs = {ov: [torch.full((m, d), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in ins]
            for ov in (True, False)}

    def call(t, y, overlap):
        return lambda: _C.ffn_launch(launch.kernel, t["x"], t["w_up"], t["w_down"], t["w_gate"], None, None, None,
                                     "silu", y, buf.capsule, torch.cuda.current_stream().cuda_stream,
                                     overlap=overlap)
    for ov in (True, False):
        g = graph_of([call(ins[i % 4], outs[ov][i % 4], ov) for i in range(8)])
        for y in outs[ov]:
            y.fill_(float("nan"))
        g.replay()
        g.replay()
    torch.cuda.synchronize()
    for t, early, serial in zip(ins, outs[True], outs[False]):
        ref = fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **t)
        assert rel_error(early, ref) < 1.5e-2
        assert torch.equal(early, serial)


@pytest.mark.parametrize("m,shape", [(16, {}), (40, {}), (40, dict(cluster=(2, 1, 1, 1))),
                                     (40, dict(cluster=(1, 2, 1, 2))), (40, dict(phases=1)),
                                     (40, dict(phases=1, lspan=8, s2=32))])
def test_stream_trace_records_every_unit_once(m, shape):
    """Every unit is claimed, gets data and ends once, in order; in cluster pairs a ghost (the missing second
    row tile of a pair) records nothing, so every record is a real unit's; one phase has only phase-2 units;
    units spanning every l-tile record themselves, then the l-tiles blocks without a unit took as helpers."""
    p = fuser.plan(m, 1024, 4096, gated=True, activation="silu", target="h200", fused=True, kind="stream", bm=16,
                   **shape)
    t = tensors(m, 1024, 4096, 1024, True, 2)
    y = torch.empty(m, 1024, device="cuda", dtype=torch.bfloat16)
    units = p.derived["units"]
    span, rows, lt = p.raw["params"]["lspan"], -(-m // 16), p.derived["lt2"]
    steal = span == lt > 1
    owners = rows * p.splits[1] if steal else units
    assert units == (owners * (1 + lt) if steal else
                     rows * (p.derived["nt1"] * p.splits[0] * (p.raw["params"]["phases"] == 2) + -(-lt // span) * p.splits[1]))
    words = _C.STREAM_TRACE_WORDS
    trace = torch.zeros(units * words * 2, device="cuda", dtype=torch.float32)
    dev, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, dev)
    buf = launch.scratch(m, stream)
    _C.ffn_launch(launch.kernel, t["x"], t["w_up"], t["w_down"], t["w_gate"], None, None, None, "silu", y,
                  buf.capsule, stream, trace=trace)
    torch.cuda.synchronize()
    tr = trace.view(torch.int64).reshape(units, words).cpu()
    if steal:   # every unit, and the pieces helpers took (96 slices on 132 SMs: 36 blocks help from the start)
        helped = tr[owners:][tr[owners:, 1] > 0]
        assert 0 < len(helped) < owners * lt and bool((tr[:owners, 1] > 0).all())
        tr = torch.cat([tr[:owners], helped])
    claimed, first, done, mma, waited, issued = tr[:, 1], tr[:, 3], tr[:, 4], tr[:, 6], tr[:, 7], tr[:, 8]
    assert bool((claimed > 0).all()) and bool((done >= first).all()) and bool((first >= claimed).all())
    # the main loop ends between the first data and the end, and waited at most its own length
    assert bool((mma >= first).all()) and bool((done >= mma).all()) and bool((waited <= mma - first).all())
    assert bool((issued >= claimed).all())
    assert int(tr[:, 0].max()) < _C.kernel_info(launch.kernel)["persistent_clusters"] * p.derived["cluster_size"]
    with pytest.raises(ValueError, match="trace"):
        _C.ffn_launch(launch.kernel, t["x"], t["w_up"], t["w_down"], t["w_gate"], None, None, None, "silu", y,
                      buf.capsule, stream, trace=trace[:8])


def test_gemm_probe_matches_torch():
    """Every variant, bfloat16 and e4m3 operands (ragged M, N and K: partial tiles and a partial K step),
    against the product of the same values in float32."""
    for v in probes.GEMM_VARIANTS:
        r = probes.gemm(300, 520, 136, v, sets=1, iters=2)
        assert r["rel_error"] < 1e-2, (v, r)
        r = probes.gemm(300, 528, 144, v, sets=1, iters=2, dtype="e4m3")
        assert r["dtype"] == "e4m3" and r["rel_error"] < 1e-2, (v, r)
    with pytest.raises(ValueError, match="multiples of 16"):
        probes.gemm(64, 64, 40, dtype="e4m3")
    with pytest.raises(ValueError, match="gemm probe dtype"):
        probes.gemm_kernel(probes.GEMM_VARIANTS[0], "float8")
    with pytest.raises(ValueError, match="K a multiple of 8"):
        k = probes.gemm_kernel((256, 4, 1))
        a = torch.randn(64, 12, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
        _C.gemm_launch(k, a, torch.randn(64, 12, device="cuda", dtype=torch.bfloat16), c, 256, 1,
                       probes.gemm_smem(256, 4), torch.cuda.current_stream().cuda_stream)


def test_stream_probe_reads_at_a_physical_rate():
    """The weight stream alone reads a matrix bigger than L2 at a rate between a tenth of HBM's and its
    peak (4.8 TB/s on an H200), as torch's read of it does, by every load path: TMA, TMA with every slot
    converted from e4m3 by the consumers, loads into registers, and both in memory order (1-D bulk copies,
    linear loads into registers)."""
    firsts = {}
    for v in probes.STREAM_VARIANTS:
        firsts.setdefault(v[2], v)
    for v in firsts.values():
        r = probes.stream(132 * 256 * 4, 1024, v, iters=3)
        assert 0.4 < r["tbps"] < 5.0 and 0.4 < r["torch_tbps"] < 5.0, r


@pytest.mark.parametrize("kind", ["stream", "cluster"])
def test_prepared_launch_runs_like_a_launch_at_new_addresses(kind):
    """A launch prepared once (_C.ffn_prepare) and run at the addresses of other tensors of the same shapes
    (_C.ffn_run) computes exactly what a full launch of those tensors computes, for both kernel families:
    new x and y, and (prepared with keep=False) another layer's weights; its misuse is refused before
    anything runs."""
    m, d, f, l = 16, 768, 3072, 768
    cons = dict(kind="stream", bm=16, s1=2, s2=4) if kind == "stream" else dict(kind="cluster")
    p = fuser.plan(m, d, f, gated=True, activation="silu", target="h200", fused=True, **cons)
    dev, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, dev)
    buf = launch.scratch(m, stream)
    a, b = tensors(m, d, f, l, True, 11), tensors(m, d, f, l, True, 12)
    roles = ("w_up", "w_down", "w_gate")

    def full(t):
        y = torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16)
        _C.ffn_launch(launch.kernel, t["x"], t["w_up"], t["w_down"], t["w_gate"], None, None, None, "silu", y,
                      buf.capsule, stream)
        return y

    y0 = torch.empty(m, l, device="cuda", dtype=torch.bfloat16)
    caps = [torch._C._to_dlpack_versioned(a[r]) for r in roles]
    kept = _C.ffn_prepare(launch.kernel, a["x"], caps[0], caps[1], caps[2], None, None, None, "silu", y0,
                          buf.capsule, stream, 0b1110)
    free = _C.ffn_prepare(launch.kernel, a["x"], a["w_up"], a["w_down"], a["w_gate"], None, None, None, "silu",
                          y0, buf.capsule, stream, keep=False)
    ya, yb, yw = (torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    xb = b["x"].clone()
    _C.ffn_run(kept, a["x"].data_ptr(), ya.data_ptr())
    _C.ffn_run(kept, xb.data_ptr(), yb.data_ptr())               # new x and y, the prepared weights
    _C.ffn_run(free, b["x"].data_ptr(), yw.data_ptr(), *(b[r].data_ptr() for r in roles), None, None, None)
    torch.cuda.synchronize()
    assert torch.equal(ya, full(a))
    assert torch.equal(yb, full(dict(a, x=b["x"])))
    assert torch.equal(yw, full(b))
    assert rel_error(yw, fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **b)) < 1.5e-2

    with pytest.raises(ValueError, match="keep=False"):
        _C.ffn_run(free, a["x"].data_ptr(), ya.data_ptr())
    with pytest.raises(ValueError, match="w_gate: this launch holds no weights"):
        _C.ffn_run(free, a["x"].data_ptr(), ya.data_ptr(), a["w_up"].data_ptr(), a["w_down"].data_ptr(), None,
                   None, None, None)
    with pytest.raises(ValueError, match="b_up: this launch was prepared without it"):
        _C.ffn_run(kept, a["x"].data_ptr(), ya.data_ptr(), None, None, None, a["w_up"].data_ptr(), None, None)
    with pytest.raises(ValueError, match="y: the kernel needs 16-byte aligned data"):
        _C.ffn_run(kept, a["x"].data_ptr(), ya.data_ptr() + 2)
    with pytest.raises(ValueError, match="must be borrowed"):
        _C.ffn_prepare(launch.kernel, a["x"], torch._C._to_dlpack_versioned(a["w_up"]), caps[1], caps[2], None,
                       None, None, "silu", y0, buf.capsule, stream, 0b1100)
    with pytest.raises(ValueError, match="w_down"):                   # validated like a launch
        _C.ffn_prepare(launch.kernel, a["x"], a["w_up"], a["w_down"][:, :8], a["w_gate"], None, None, None,
                       "silu", y0, buf.capsule, stream)


# Narrow n-tiles (48, 96, 112 wide) over a d_ff whose last K step's padded end lies past the start of an n-tile
# that does not exist (d_ff 2000: 21 tiles of 96 end at 2016, the K steps at 2048; 6600: 59 tiles of 112 end at
# 6608, the steps at 6656; 1000: 21 tiles of 48 end at 1008, the steps at 1024): (m, d_model, d_ff, gated, bias,
# tiles), the first the planner's own h100 pick for its shape (tiles None).
NARROW_EDGES = [
    (128, 4096, 2000, True, False, None),
    (128, 4096, 2000, True, False, dict(bm=64, bn=96, bl=128, s1=3, s2=2)),
    (200, 512, 2000, True, True, dict(bm=128, bn=96, bl=64, s1=1, s2=3)),
    (77, 1024, 6600, False, False, dict(bm=64, bn=112, bl=64, s1=2, s2=8)),
    (33, 768, 6600, False, True, dict(bm=128, bn=112, bl=64, s1=1, s2=4)),
    (200, 512, 1000, True, True, dict(bm=128, bn=48, bl=64, s1=2, s2=3)),
]


def test_narrow_tiles_over_a_d_ff_that_ends_inside_a_k_step():
    """Phase 2's wait for its split's H counts the n-tiles that overlap the split's d_ff range, which ends at
    d_ff; counted up to the last K step's padded end instead, the last split waits for an n-tile no unit
    computes and the launch never ends. Run in a child process with a timeout, so such a hang fails the test
    (the child's end frees the GPU); every output matches the float64 reference, bitwise on repeats."""
    import subprocess
    pick = fuser.plan(128, 4096, 2000, gated=True, activation="silu", target="h100")
    bn = pick.tiles["bn"]
    assert pick.kind == "stream" and bn in (48, 96) and 2000 < (2000 // bn + 1) * bn < 2048, pick.summary()
    script = (
        "import json, sys, torch, fuser\n"
        f"sys.path.insert(0, {os.path.join(os.path.dirname(__file__), 'gpu')!r})\n"
        "from plan_check import ffn_tensors, check_plan\n"
        f"for m, d, f, gated, bias, tiles in {NARROW_EDGES!r}:\n"
        "    act = 'silu' if gated else 'gelu'\n"
        "    forced = dict(fused=True, kind='stream', **tiles) if tiles else {}\n"
        "    p = fuser.plan(m, d, f, gated=gated, activation=act, bias=bias, target='h100', **forced)\n"
        "    t = ffn_tensors(torch.Generator(device='cuda').manual_seed(f + m), m, d, f, d, gated=gated, bias=bias,\n"
        "                    dtype=torch.bfloat16)\n"
        "    r = check_plan(p, act, t)\n"
        "    print(json.dumps(dict(r, plan=p.summary(), m=m, d_ff=f)), flush=True)\n")
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a launch did not end in 240 s (a split waiting for H no unit writes): {e.stdout!r}")
    lines = [json.loads(s) for s in r.stdout.splitlines() if s.startswith("{")]
    assert r.returncode == 0, (r.stderr[-2000:], lines)
    assert len(lines) == len(NARROW_EDGES) and all(x["ok"] for x in lines), lines

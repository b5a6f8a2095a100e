"""The command line: ``python -m fuser demo`` builds, optimizes and checks a random LLaMA (and says how
to get transformers when it is missing); ``env`` still works; ``explain`` prints the report and the
planner's explanation per FFN shape; ``warmup`` compiles the model's fused kernels (clean: no spills)
and says what it needs without NVRTC; ``bench`` refuses clearly without a Hopper GPU. ``fuser.warmup``
and ``fuser.tools.bench.run`` are the functions behind them."""
import os
import subprocess
import sys

import pytest
from torch import nn

import fuser
import models  # noqa: F401  (makes transformers importable beside CI's CPU torch)
from conftest import hopper_reason
from fuser.tools import bench, cli

TESTS = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--hidden", "128", "--intermediate", "352", "--heads", "4"]


def run_cli(*args, env=None):
    """``python -m fuser ARGS`` in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "fuser", *args], capture_output=True, text=True, timeout=300,
                          cwd=TESTS, env={**os.environ, **(env or {})})


def test_demo_optimizes_and_checks_a_llama(capsys):
    assert cli.main(["demo", "--hidden", "128", "--intermediate", "352", "--heads", "4", "--seq", "16"]) == 0
    out = capsys.readouterr().out
    assert "fuser: 2 FFN(s) found: 2 swapped, 0 fusible, 0 skipped" in out
    assert "model.layers.1.mlp  [LlamaMLP]  FFN 128 -> 352 -> 128, gated, activation=silu" in out
    assert "result      : OK" in out


def test_demo_command_runs_beside_a_torchvision_built_for_another_torch():
    """What a user types, outside pytest: where the torchvision installed cannot load its ops (CI's CPU
    torch beside PyPI's CUDA torchvision), the demo still imports transformers (fuser/tools/compat.py)."""
    r = run_cli("demo", *SMALL, "--seq", "16")
    assert r.returncode == 0, r.stderr
    assert "result      : OK" in r.stdout


def test_demo_default_shapes_on_this_machine(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "hidden 512, intermediate 1376, 2 layers, vocab 1000" in out and "FFN 512 -> 1376 -> 512" in out


def test_demo_without_transformers_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert cli.main(["demo"]) == 2
    assert "pip install 'fuser[demo]'" in capsys.readouterr().err


def test_env_command():
    r = subprocess.run([sys.executable, "-m", "fuser", "env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "fused path" in r.stdout


@pytest.mark.gpu
def test_demo_times_on_hopper(capsys):
    assert cli.main(["demo", "--iters", "5"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16 on cuda" in out and "PyTorch     :" in out and "fuser       :" in out


def test_explain_prints_report_and_plans():
    r = run_cli("explain", *SMALL, "--tokens", "16")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "fuser: 2 FFN(s) found: 2 swapped, 0 fusible, 0 skipped" in out
    want = fuser.plan(128, 128, 352, gated=True, activation="silu", dtype="bfloat16")
    assert f"dtype=bfloat16, bias=none; plan @128 tokens: {want.summary()}" in out
    head = "== FFN 128 -> 352 -> 128, gated silu, bfloat16, no bias (2 FFN(s): model.layers.0.mlp, model.layers.1.mlp) at 16 tokens =="
    assert out.count("== FFN ") == 1 and head in out
    assert head + "\non this machine: runs PyTorch ops here (weights on cpu)\n" in out
    explained = fuser.plan(16, 128, 352, gated=True, activation="silu", dtype="bfloat16").explain()
    first_lines = explained.splitlines()[:3]            # the search timing line differs from run to run
    assert all(line in out for line in first_lines), first_lines


def nvrtc_or_skip():
    if not fuser.env().nvrtc_found:
        pytest.skip("needs NVRTC (pip install nvidia-cuda-nvrtc)")


def test_warmup_compiles_every_kernel_clean(tmp_path):
    nvrtc_or_skip()
    env = {"FUSER_CACHE_DIR": str(tmp_path)}
    r = run_cli("warmup", *SMALL, "--tokens", "1,16,128", env=env)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("FFN 128 -> 352 -> 128")]
    assert lines and all("best fused: fused " in line or "chosen: fused " in line for line in lines)
    assert all(" 0 spill bytes, compiled, " in line and " registers, " in line for line in lines), lines
    assert f"{len(lines)} kernel(s) ready, 0 spill bytes in all" in r.stdout
    assert r.stdout.count("the eager route's gate kernel: ") == 1   # a gated LLaMA: its eager route's kernel too
    again = run_cli("warmup", *SMALL, "--tokens", "1,16,128", env=env)
    hits = [line for line in again.stdout.splitlines() if "0 spill bytes, cache hit" in line]
    assert again.returncode == 0 and len(hits) == len(lines) + 1, again.stdout
    assert all(line.startswith(("FFN 128 -> 352 -> 128", "the eager route's gate kernel: ")) for line in hits)


def test_warmup_without_nvrtc_exits_2(tmp_path):
    r = run_cli("warmup", *SMALL, env={"FUSER_NVRTC": str(tmp_path / "libnvrtc.so.missing")})
    assert r.returncode == 2 and "NVRTC" in r.stderr and "nvidia-cuda-nvrtc" in r.stderr


def test_warmup_function(tmp_path, monkeypatch):
    nvrtc_or_skip()
    monkeypatch.setenv("FUSER_CACHE_DIR", str(tmp_path))
    ffn = lambda: nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))  # noqa: E731
    model = fuser.optimize(nn.Sequential(ffn(), nn.LayerNorm(256), ffn()).bfloat16())
    lines = []
    kernels = fuser.warmup(model, tokens=(16, 128), target="h200", log=lines.append)
    best = {fuser._C.codegen(fuser.plan(m, 256, 1024, bias=True, dtype="bfloat16", fused=True, target="h200")._d,
                             "h200") for m in (16, 128)}
    assert {k.source for k in kernels} >= best and len(kernels) == len(lines) == len({k.key for k in kernels})
    assert all(k.spill_bytes == 0 and k.plan.fused and k.cubin[:4] == b"\x7fELF" for k in kernels)
    with pytest.raises(ValueError, match="fuser.optimize"):
        fuser.warmup(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
    assert fuser.warmup(fuser.optimize(ffn()), log=lines.append) == []   # float32: nothing to compile
    assert lines[-1].endswith("runs PyTorch eager ops at every token count; nothing to compile")


@pytest.mark.skipif(hopper_reason() is None, reason="checks the message shown where there is no Hopper GPU")
def test_bench_needs_hopper():
    r = subprocess.run([sys.executable, "-m", "fuser", "bench"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "fuser bench times kernels on a Hopper GPU (sm_90): " + hopper_reason() in r.stderr
    with pytest.raises(RuntimeError, match="Hopper"):
        bench.run([bench.parse_workload("gpt2:16")])


def test_bench_takes_the_fewest_calls_per_graph_as_a_count():
    """`--graph-calls` is a count of 1 or more; anything else is a usage error naming the option (before any GPU
    work, so it reads the same on every machine)."""
    for bad in ("0", "-3", "many"):
        r = subprocess.run([sys.executable, "-m", "fuser", "bench", "--graph-calls", bad], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and "--graph-calls" in r.stderr and "expected an integer from 1" in r.stderr, r.stderr


def test_bench_takes_what_graphed_calls_follow_from_a_fixed_list():
    """`--graph-after` is op or self; anything else is a usage error listing both, before any GPU work."""
    r = subprocess.run([sys.executable, "-m", "fuser", "bench", "--graph-after", "norm"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--graph-after" in r.stderr and "'op', 'self'" in r.stderr, r.stderr


@pytest.mark.gpu
def test_bench_on_hopper(tmp_path):
    """A small run of the harness: every variant but max-autotune timed for a model and a paper workload,
    the CSV, tables and plot written, the floor from the rates measured in the same run."""
    import json

    from fuser.tools import bench_report
    from fuser.tools.bench import BASELINES, VARIANTS
    r = subprocess.run([sys.executable, "-m", "fuser", "bench", "--shape", "gpt2:128", "--shape", "G1", "--reps", "5",
                        "--autotune", "none", "--graph-calls", "6", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=560)
    assert r.returncode == 0, r.stderr
    rows = bench_report.read_csv(tmp_path / "results.csv")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert [(x["workload"], x["m"]) for x in rows] == [("gpt2", 128), ("G1", 128)]
    for x in rows:
        for v in VARIANTS:
            assert (x[f"{v}_us"] is None) == v.startswith("autotune"), (v, x)
        assert x["compile_compile_s"] > 0 and x["sm_mhz_max"] > 0
        assert 6 <= x["graph_calls"] <= bench.GRAPH_MAX_CALLS, x["graph_calls"]   # G1 and gpt2:128 are short calls
        # each graphed call followed a copy writing its input, timed alone and taken off every graphed time
        assert x["graph_after"] == "op" and 0 < x["graph_op_us"] < 10, x    # a copy of at most 0.2 MB
        assert all(x[f"{v}_us"] > 0 for v in VARIANTS if v.endswith("_graph") and x[f"{v}_us"] is not None), x
        w = bench.Workload(x["workload"], x["m"], x["d_model"], x["d_ff"], x["d_out"], x["gated"], x["activation"])
        assert abs(x["floor_us"] - w.floor_us(meta["matmul_tflops"], meta["copy_tbps"])[0]) < 0.01
        assert abs(x["speedup_vs_eager_graph"] - x["eager_graph_us"] / x["fuser_graph_us"]) < 0.01
    assert 300 < meta["matmul_tflops"] < 1200 and 2 < meta["copy_tbps"] < 6
    assert meta["host"]["jit_s"] > meta["host"]["cache_load_s"] and meta["host"]["call_us"] > 0
    assert "| gpt2 | 128 |" in (tmp_path / "results.md").read_text()
    card = (tmp_path / "targets.md").read_text()     # G1 is one of the paper table's 18 rows
    assert "| paper's table: fuser vs eager, both in CUDA graphs | geomean >= 2.200x |" in card and "| G1 | 128 |" in card
    import importlib.util
    if importlib.util.find_spec("matplotlib"):      # the plot is optional; CPU tests draw it from a CSV
        assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    assert set(BASELINES) < set(VARIANTS)


def test_demo_says_why_transformers_cannot_be_imported(monkeypatch):
    """Installed but broken (CI's CPU torch beside a CUDA torchvision) is not 'not installed'."""
    import importlib.util

    from fuser.tools.cli import _transformers_missing
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as r:
            raise ModuleNotFoundError("Could not import module 'LlamaConfig'.") from r
    except ImportError as e:
        broken = e
    msg = _transformers_missing(broken)
    assert "installed but fails to import (RuntimeError: operator torchvision::nms" in msg
    assert "torchvision built for your torch" in msg
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert _transformers_missing(broken).endswith("not installed: python -m pip install 'fuser[demo]'")

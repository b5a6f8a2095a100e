"""The command line: ``python -m fuser demo`` builds, optimizes and checks a random LLaMA (and says how
to get transformers when it is missing); ``python -m fuser env`` still works."""
import subprocess
import sys

import pytest

import models  # noqa: F401  (makes transformers importable beside CI's CPU torch)
from fuser import cli


def test_demo_optimizes_and_checks_a_llama(capsys):
    assert cli.main(["demo", "--hidden", "128", "--intermediate", "352", "--heads", "4", "--seq", "16"]) == 0
    out = capsys.readouterr().out
    assert "fuser: 2 FFN(s) found: 2 fused, 0 fusible, 0 skipped" in out
    assert "model.layers.1.mlp  [LlamaMLP]  FFN 128 -> 352 -> 128, gated, activation=silu" in out
    assert "result      : OK" in out


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

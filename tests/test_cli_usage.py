"""The command line answers a value it cannot take as argparse does: the usage, then one line
``python -m fuser COMMAND: error: ...`` naming the option, exit status 2, never a traceback. So does
``fuser.warmup`` for its ``tokens`` argument, with a TypeError or ValueError naming it."""
import subprocess
import sys

import pytest
from torch import nn

import fuser
from fuser.tools import cli

PLAN = ["plan", "--tokens", "4", "--d-model", "64", "--d-ff", "256"]

#: (arguments, what the error line says after "python -m fuser COMMAND: error: ")
BAD = [
    (["plan", "--tokens", "0", "--d-model", "64", "--d-ff", "256"], "argument --tokens/-m: expected an integer from 1"),
    (["plan", "--tokens", "-3", "--d-model", "64", "--d-ff", "256"], "argument --tokens/-m: expected an integer from 1"),
    (["plan", "--tokens", "2" + "0" * 20, "--d-model", "64", "--d-ff", "256"], "argument --tokens/-m: expected an integer"),
    (["plan", "--tokens", "four", "--d-model", "64", "--d-ff", "256"], "argument --tokens/-m: expected an integer"),
    (PLAN + ["--dataflow", "bogus"], "argument --dataflow: invalid choice: 'bogus'"),
    (PLAN + ["--target", "a100"], "argument --target: invalid choice: 'a100'"),
    (PLAN + ["--top", "0"], "argument --top: expected an integer from 1"),
    (PLAN + ["--d-out", "0"], "argument --d-out: expected an integer from 1"),
    (PLAN + ["--fused", "yes", "--dtype", "float32"], "no plan satisfies the constraints for this chain"),
    (["warmup", "--tokens", "0"], "argument --tokens: expected comma-separated positive token counts"),
    (["warmup", "--tokens", "1,x,16"], "argument --tokens: expected comma-separated positive token counts"),
    (["warmup", "--target", "a100"], "argument --target: invalid choice: 'a100'"),
    (["explain", "--tokens", "0"], "argument --tokens/-m: expected an integer from 1"),
    (["explain", "--hidden", "100"], "--hidden 100 must be a multiple of --heads 8"),
    (["demo", "--seq", "0"], "argument --seq: expected an integer from 1"),
    (["demo", "--layers", "-1"], "argument --layers: expected an integer from 1"),
    (["env", "--device", "-1"], "argument --device: expected an integer from 0"),
    (["bench", "--reps", "0"], "argument --reps: expected an integer from 1"),
    (["bench", "--budget-s", "nan"], "argument --budget-s: expected a number of seconds from 0"),
    (["bench", "--budget-s", "-1"], "argument --budget-s: expected a number of seconds from 0"),
    (["calibrate", "--k", "0"], "argument --k: expected an integer from 1"),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_values_are_usage_errors(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m fuser " + args[0])
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"python -m fuser {args[0]}: error: {says}"), err


@pytest.mark.parametrize("index", [0, 4, 5, 8, 9], ids=["plan tokens 0", "dataflow bogus", "target a100",
                                                        "no plan fits", "warmup tokens 0"])
def test_the_command_itself_prints_one_error_line_and_exits_2(index):
    args, says = BAD[index]
    r = subprocess.run([sys.executable, "-m", "fuser", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and not r.stdout, r.stderr
    assert r.stderr.rstrip("\n").splitlines()[-1].startswith(f"python -m fuser {args[0]}: error: {says}"), r.stderr


def test_a_zero_compile_budget_is_accepted(capsys):
    """--budget-s 0 (torch.compile skipped for every workload) passes the argument check: without a Hopper
    GPU the command then stops on that, not on a usage error."""
    from fuser.tools.timing import hopper_reason
    if hopper_reason() is None:
        pytest.skip("a Hopper GPU is present: the command would run the benchmark (tests/test_cli.py runs it)")
    assert cli.main(["bench", "--budget-s", "0", "--shape", "gpt2:1", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "error:" not in err and "Hopper GPU" in err, err


def test_good_values_still_plan(capsys):
    args = ["plan", "--tokens", "16", "--d-model", "1024", "--d-ff", "4096", "--dataflow", "shuffle", "--fused",
            "yes", "--target", "h100", "--json"]
    assert cli.main(args) == 0
    assert '"fused": true' in capsys.readouterr().out


def test_warmup_function_names_bad_token_counts():
    model = fuser.optimize(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
    for tokens, exc, says in [(0, ValueError, "tokens: expected token counts of at least 1, got 0"),
                              ((1, -16), ValueError, "got -16"), ((), ValueError, "got none"),
                              ("1,16", TypeError, "tokens: expected integer token counts, got str '1,16'"),
                              ((1, 2.5), TypeError, "got float 2.5"), ((True,), TypeError, "got bool True")]:
        with pytest.raises(exc, match=says):
            fuser.warmup(model, tokens=tokens)
    assert fuser.warmup(model, tokens=16) == []     # float32: nothing to compile, a single count accepted

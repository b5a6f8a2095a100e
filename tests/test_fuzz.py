"""Fuzz fuser's public entry points with seeded random calls, valid and invalid, in a subprocess (a crash
fails the test): ``fuser.ffn`` (dtypes, shapes from 0 to 2**40 as metadata, strides, storage offsets,
alignment, ``out`` aliasing its inputs, foreign DLPack producers, ``plan=``), its quantized calls
(``scales=``, e4m3 weights), the operator ``torch.ops.fuser.ffn``, ``fuser.plan``/``fuser.plans``,
``Plan.from_dict`` on tampered dicts, ``fuser.optimize`` and ``fuser.quantize`` on random small models
and the command line (in process) with bad values.

Each call is classified against the error contract (README, "Errors"): a valid call must return the
float64 reference's result within its dtype's tolerance, an invalid one must raise TypeError,
ValueError or a ``fuser.FuserError``; anything else is counted: ``leaks`` (another exception type),
``fooled`` (an invalid call accepted), ``wrong`` (a wrong result or a broken invariant),
``refused`` (a valid call raising). CI runs 5,000 calls; the long run and its counts are in
docs/robustness.md:

    python tests/test_fuzz.py --calls 20000 --seed 15
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import time
import warnings

from fuzz_fp8 import QuantizedCalls
from fuzz_models import ModelCalls
from fuzz_plans import PlanCalls
from fuzz_tensors import INVALID, VALID, TensorCalls

HERE = pathlib.Path(__file__).resolve().parent
CI_CALLS = int(os.environ.get("FUSER_FUZZ_CALLS", "5000"))
CI_SEED = int(os.environ.get("FUSER_FUZZ_SEED", "15"))


def test_fuzz_entry_points(tmp_path):
    summary = tmp_path / "summary.json"
    progress = tmp_path / "progress.txt"
    env = dict(os.environ, FUSER_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, __file__, "--calls", str(CI_CALLS), "--seed", str(CI_SEED),
                        "--summary", str(summary), "--progress", str(progress)],
                       capture_output=True, text=True, timeout=600, env=env)
    last = progress.read_text() if progress.exists() else "?"
    assert r.returncode >= 0, f"the fuzz process crashed (signal {-r.returncode}) at: {last}\n{r.stderr[-3000:]}"
    s = json.loads(summary.read_text())
    assert s["calls"] >= CI_CALLS
    bad = {k: s[k] for k in FAILURES if s[k]}
    assert not bad and r.returncode == 0, f"{bad}\n{json.dumps(s['examples'], indent=1)}\n{r.stderr[-3000:]}"


# --------------------------------------------------------------------------------------------------
# the fuzzer (runs in the child process)

#: Outcomes that fail the run: another exception type, an invalid call accepted, a wrong result or a
#: broken invariant, a valid call refused, an error message naming no argument or field.
FAILURES = ("leaks", "fooled", "wrong", "refused", "unnamed")
#: Calls whose fixes are being made in other files (the command line's usage errors; optimize with
#: hooks or quantized Linears): their failures are counted as ``open_elsewhere`` and listed, not failed
#: on. FUSER_FUZZ_STRICT=1 fails on them too; empty this once those fixes are in.
OPEN_ELSEWHERE = ()
STRICT = os.environ.get("FUSER_FUZZ_STRICT", "") not in ("", "0")


class Fuzzer(TensorCalls, QuantizedCalls, PlanCalls, ModelCalls):
    """All the call families, drawn at random with fixed weights from one seed."""

    def __init__(self, seed):
        import numpy as np
        import torch

        import fuser
        from fuser import _C
        self.np, self.torch, self.fuser, self._C = np, torch, fuser, _C
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)              # module initialisation in the optimize calls
        self.contract = (TypeError, ValueError, fuser.FuserError)
        self.dtypes = (torch.bfloat16, torch.float16, torch.float32)
        self.tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 4e-2}
        self.acts = ("relu", "gelu", "gelu_tanh", "silu")
        self.builtins = _C.targets()
        self.default_target = fuser.target.default_target()
        self.base_plans = self._base_plans()
        import dlpack_producer
        self.dl = dlpack_producer
        self.producer = dlpack_producer.Producer()
        self.setup_refusals = collections.Counter()
        self.generators = [  # (weight, generator)
            (30, self.ffn_valid), (25, self.ffn_invalid), (8, self.ffn_foreign), (4, self.ffn_huge),
            (7, self.op), (9, self.plan), (10, self.from_dict), (4, self.ffn_plan), (2, self.optimize),
            (1, self.cli), (5, self.fp8_valid), (5, self.fp8_invalid), (2, self.quantize),
        ]

    # ---- running ----
    def case(self):
        weights = [w for w, _ in self.generators]
        while True:
            gen = self.rng.choices([g for _, g in self.generators], weights)[0]
            try:
                return gen()
            except self.contract as e:   # a generator's own setup was refused: draw another
                self.setup_refusals[f"{gen.__name__}: {type(e).__name__}: {str(e)[:80]}"] += 1


def run(calls, seed, progress=None, verbose=False):
    warnings.simplefilter("ignore")
    fz = Fuzzer(seed)
    counts = collections.Counter()
    by_entry = collections.defaultdict(collections.Counter)
    examples = collections.defaultdict(list)
    log = open(progress, "w") if progress else None
    t0 = time.perf_counter()
    for i in range(calls):
        case = fz.case()
        if log:
            log.seek(0)
            log.write(f"{i} {case.entry} {case.label}\n")
            log.truncate()
            log.flush()
        outcome, detail = classify(fz, case)
        by_entry[case.entry][outcome] += 1
        failed = outcome in FAILURES
        if failed and not STRICT and f"{case.entry} {case.label}".startswith(OPEN_ELSEWHERE):
            outcome = "open_elsewhere"
        counts[outcome] += 1
        if failed and len(examples[outcome]) < 12:
            examples[outcome].append(f"{case.entry} {case.label}: {detail}")
        if failed and verbose:
            print(f"{i} {outcome} {case.entry} {case.label}: {detail}", file=sys.stderr)
    summary = dict(calls=calls, seed=seed, seconds=round(time.perf_counter() - t0, 1),
                   valid_ok=counts["valid_ok"], accepted=counts["accepted"], clean_errors=counts["clean_errors"],
                   **{k: counts[k] for k in FAILURES}, crashes=0, open_elsewhere=counts["open_elsewhere"],
                   setup_refusals=sum(fz.setup_refusals.values()),
                   by_entry={k: dict(v) for k, v in sorted(by_entry.items())}, examples=dict(examples))
    return summary


#: Words a contract error's message must contain one of: the argument or field it is about.
NAMES = frozenset(
    "x w_up w_down w_gate b_up b_gate b_down out activation plan m d_model d_ff d_out gated bias dtype target "
    "fused cluster dataflows avoid bm bn bl n_iters stages order gate_mode kind s1 s2 k chain params search "
    "runner_up tokens constraints scales x_scale up_scale gate_scale down_scale h_scale".split())


def classify(fz, case):
    """(outcome, detail): valid_ok / accepted / clean_errors, or a failure: leaks / fooled / wrong / refused /
    unnamed (a contract error whose message names no argument or field)."""
    try:
        res = case.call()
    except fz.contract as e:
        if case.expect == VALID:
            return "refused", f"{type(e).__name__}: {str(e)[:200]}"
        if case.entry != "cli" and not NAMES.intersection(re.findall(r"[A-Za-z_]\w*", str(e))):
            return "unnamed", f"{type(e).__name__}: {str(e)[:200]}"
        return "clean_errors", None
    except Exception as e:  # noqa: BLE001 (the point: any other exception breaks the contract)
        return "leaks", f"{type(e).__name__}: {str(e)[:200]}"
    if case.expect == INVALID:
        return "fooled", f"accepted: {str(res)[:120]}"
    try:
        problem = case.check(res) if case.check else None
    except fz.contract as e:
        problem = f"checking the result raised {type(e).__name__}: {str(e)[:160]}"
    except Exception as e:  # noqa: BLE001
        return "leaks", f"checking the result: {type(e).__name__}: {str(e)[:200]}"
    if problem:
        return "wrong", problem
    return ("valid_ok" if case.expect == VALID else "accepted"), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=CI_CALLS)
    ap.add_argument("--seed", type=int, default=CI_SEED)
    ap.add_argument("--summary", help="write the counts as JSON here too")
    ap.add_argument("--progress", help="keep the call in progress here (what a crash was doing)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure as it happens")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    s = run(args.calls, args.seed, args.progress, args.verbose)
    text = json.dumps(s, indent=1)
    print(text)
    if args.summary:
        pathlib.Path(args.summary).write_text(text)
    return 1 if any(s[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())

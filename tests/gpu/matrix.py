"""The GPU correctness matrix of the fused kernels: every dataflow x plain / gated spatial /
gated sequential x the four activations x bias or not x bfloat16 / float16, over the shapes
M in {1, 7, 64, 127, 128, 1000, 4096}, d_model in {256, 768, 4096}, d_ff in {1024, 3072, 11008, 14336}.

Each case forces the best plan that uses its dataflow, draws fresh random inputs, poisons the output
with NaN, and checks: the relative error against a float64 reference is at most twice PyTorch eager's
own (same dtype); every element was written; three runs are bitwise identical. Run by
tests/test_gpu_kernels.py, or directly (``python tests/gpu/matrix.py [--quick] [--json FILE]``)."""
import argparse
import itertools
import json
import sys
import time

import torch

import fuser
from plan_check import check_plan, ffn_tensors

MS = (1, 7, 64, 127, 128, 1000, 4096)
DMODELS = (256, 768, 4096)
DFFS = (1024, 3072, 11008, 14336)
DATAFLOWS = ("all_exchange", "shuffle", "reduce_scatter", "inter_cluster_reduce", "local")
GATES = ("plain", "spatial", "sequential")
ACTS = ("relu", "gelu", "gelu_tanh", "silu")


def cases(quick=False):
    # gated spatial mode puts gate and up on different blocks, so it always uses all_exchange: "local"
    # (no exchange at all) does not apply to it
    combos = [c for c in itertools.product(DATAFLOWS, GATES, ACTS, (False, True), ("bfloat16", "float16"))
              if not (c[0] == "local" and c[1] == "spatial")]
    if quick:
        combos = combos[::7]
    for i, (df, gate, act, bias, dtype) in enumerate(combos):
        shape = (MS[i % len(MS)], DMODELS[(i // len(MS)) % len(DMODELS)], DFFS[(i // 3) % len(DFFS)])
        yield dict(dataflow=df, gate=gate, activation=act, bias=bias, dtype=dtype, m=shape[0], d_model=shape[1],
                   d_ff=shape[2])


def find_plan(c):
    """The best fused plan using the case's dataflow; the shape shrinks (d_ff, then d_model) until one
    exists (e.g. 'local' needs the whole d_ff of a row tile in one block)."""
    m, d, f = c["m"], c["d_model"], c["d_ff"]
    kw = dict(gated=c["gate"] != "plain", activation=c["activation"], bias=c["bias"], dtype=c["dtype"],
              target="h200", fused=True, kind="cluster")
    if c["gate"] != "plain":
        kw["gate_mode"] = c["gate"]
    if c["dataflow"] == "local":
        kw["avoid"] = list(fuser.DATAFLOWS)
    else:
        kw["dataflows"] = [c["dataflow"]]
    for ff, dm in [(f, d), (1024, d), (1024, 256), (512, 256), (256, 256)]:
        try:
            return fuser.plan(m, dm, ff, **kw), dm, ff
        except ValueError:
            continue
    return None, d, f


def run_case(c, gen):
    plan, d, f = find_plan(c)
    if plan is None:
        return dict(c, status="no plan")
    gated = c["gate"] != "plain"
    t = ffn_tensors(gen, c["m"], d, f, d, gated=gated, bias=c["bias"], dtype=c["dtype"])
    return dict(c, d_model=d, d_ff=f, plan=plan.summary(), dataflows=list(plan.dataflows),
                **check_plan(plan, c["activation"], t))


def run(quick=False, log=print, dataflow=None, first=None, skip=0):
    gen = torch.Generator(device="cuda").manual_seed(1234)
    results = []
    t0 = time.time()
    selected = [c for c in cases(quick) if dataflow is None or c["dataflow"] == dataflow]
    for c in selected[skip:][:first]:
        res = run_case(c, gen)
        results.append(res)
        if res.get("status") == "no plan":
            log(f"{c['dataflow']:22s} {c['gate']:10s} {c['activation']:9s} bias={c['bias']!s:5s} {c['dtype']:8s} "
                f"no plan")
            continue
        log(f"{'ok ' if res['ok'] else 'BAD'} {res['dataflow']:22s} {res['gate']:10s} {res['activation']:9s} "
            f"bias={res['bias']!s:5s} {res['dtype']:8s} M={res['m']:<5d} d={res['d_model']:<5d} f={res['d_ff']:<6d} "
            f"err {res['err']:.2e} (eager {res['eager_err']:.2e}) nan={res['nan']} same={res['identical']}  "
            f"{res['plan']}")
    ran = [r for r in results if "ok" in r]
    summary = dict(cases=len(results), ran=len(ran), failed=sum(not r["ok"] for r in ran),
                   no_plan=len(results) - len(ran), seconds=round(time.time() - t0, 1),
                   worst_ratio=max((r["err"] / r["eager_err"] for r in ran), default=0.0),
                   worst_err={dt: max((r["err"] for r in ran if r["dtype"] == dt), default=0.0)
                              for dt in ("bfloat16", "float16")},
                   dataflows_covered=sorted({d for r in ran for d in r["dataflows"]} |
                                            ({"local"} if any(not r["dataflows"] for r in ran) else set())),
                   gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    return summary, results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dataflow", default=None, choices=DATAFLOWS, help="only the cases of one dataflow")
    ap.add_argument("--first", type=int, default=None, help="only the first N cases (after --skip)")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N cases")
    a = ap.parse_args()
    summary, results = run(a.quick, dataflow=a.dataflow, first=a.first, skip=a.skip)
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(summary=summary, results=results), f, indent=1)
    sys.exit(1 if summary["failed"] else 0)

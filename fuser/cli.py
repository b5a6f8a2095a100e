"""The command line: ``python -m fuser <command>``.

Commands:
    env     what fuser found (driver, GPU, NVRTC, cache) and whether the fused path is available
    plan    plan one FFN shape and explain the choice (or print the top plans, or the JSON)
    demo    run a small random LLaMA-shaped FFN through fuser.ffn and check it against float64
"""
from __future__ import annotations

import argparse
import sys


def _cmd_env(args):
    import fuser
    print(fuser.env(args.device))
    return 0


def _cmd_plan(args):
    import json

    import fuser
    kw = dict(d_out=args.d_out, gated=args.gated, activation=args.activation, bias=args.bias, dtype=args.dtype,
              target=args.target)
    if args.fused is not None:
        kw["fused"] = args.fused == "yes"
    if args.dataflow:
        kw["dataflows"] = args.dataflow
    if args.top > 1:
        for i, p in enumerate(fuser.plans(args.tokens, args.d_model, args.d_ff, k=args.top, **kw)):
            print(f"{i + 1:3d}. {p.summary()}")
        return 0
    p = fuser.plan(args.tokens, args.d_model, args.d_ff, **kw)
    print(json.dumps(p.to_dict(), indent=2) if args.json else p.explain())
    return 0


def rel_error(y, ref):
    """||y - ref|| / ||ref|| in float64 (a scale-independent error; NaN never passes)."""
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def _cmd_demo(args):
    import torch

    import fuser

    e = fuser.env()
    print("== environment ==")
    print(e)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    d_model, d_ff, tokens = args.d_model, args.d_ff, args.tokens
    print(f"\n== a LLaMA-shaped FFN: d_model={d_model}, d_ff={d_ff}, SwiGLU, {tokens} tokens, "
          f"{str(dtype).replace('torch.', '')} on {device} ==")
    g = torch.Generator().manual_seed(args.seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x = rand(tokens, d_model)
    w_gate, w_up = rand(d_ff, d_model, scale=d_model ** -0.5), rand(d_ff, d_model, scale=d_model ** -0.5)
    w_down = rand(d_model, d_ff, scale=d_ff ** -0.5)
    y = fuser.ffn(x, w_up, w_down, w_gate=w_gate, activation="silu")
    ref = fuser.ffn_reference(x, w_up, w_down, w_gate=w_gate, activation="silu", compute_dtype=torch.float64)
    eager = fuser.ffn_reference(x, w_up, w_down, w_gate=w_gate, activation="silu")
    err, err_eager = rel_error(y, ref), rel_error(eager, ref)
    fused = e.fused_available and device == "cuda"
    print("path        :", "fused kernel" if fused else "PyTorch reference (" + e.why + ")")
    print(f"error       : {err:.2e} relative to float64 (PyTorch eager in bf16: {err_eager:.2e})")
    ok = err <= max(2 * err_eager, 1e-2)
    print("result      :", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fuser", description="fuser: fused FFN kernels for Hopper GPUs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env", help="show what fuser found and whether the fused path is available")
    p.add_argument("--device", type=int, default=None, help="CUDA device ordinal (default: current)")
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("plan", help="plan one FFN shape and explain the choice")
    p.add_argument("--tokens", "-m", type=int, required=True, help="tokens (M)")
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--d-ff", type=int, required=True)
    p.add_argument("--d-out", type=int, default=None, help="output width (default: d_model)")
    p.add_argument("--gated", action="store_true", help="gated FFN (SwiGLU with silu, GeGLU with gelu)")
    p.add_argument("--activation", default="gelu", choices=["relu", "gelu", "gelu_tanh", "silu"])
    p.add_argument("--bias", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--target", default=None, help="h200 or h100 (default: this machine's GPU, else h200)")
    p.add_argument("--fused", choices=["yes", "no"], default=None, help="force or forbid fusion")
    p.add_argument("--dataflow", action="append", help="require a dataflow (repeatable)")
    p.add_argument("--top", type=int, default=1, help="list the best N plans instead of explaining one")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("demo", help="run a random LLaMA-shaped FFN and check it against float64")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=1376)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

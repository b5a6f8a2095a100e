"""A quick side-by-side timing of fuser.ffn against PyTorch eager on a few FFN shapes (CUDA events,
interleaved, medians, several weight sets rotated so the L2 does not flatter anyone). The timing is
fuser.bench.bench (also `python -m fuser bench`); the full harness is issue #6."""
import sys

from fuser.bench import QUICK_SHAPES, bench, hopper_reason


def main():
    why = hopper_reason()
    if why is not None:
        print(f"quick_ffn times kernels on a Hopper GPU: {why}", file=sys.stderr)
        return 2
    bench(QUICK_SHAPES, iters=30, log=lambda row: print(row, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The side-by-side FFN benchmark (the same as ``python -m fuser bench``): fuser against
PyTorch eager, CUDA graphs, torch.compile (default and max-autotune), the cuBLAS GEMMs alone and the
roofline floor, interleaved, CUDA events, medians, rotated inputs, clocks logged. See fuser/tools/bench.py.

    python benchmarks/ffn.py --set all --out bench-out          # the full list (~10 minutes on an H200)
    python benchmarks/ffn.py --shape llama3-8b:16 --shape G3    # any workloads
    python benchmarks/ffn.py --plot bench-out/results.csv       # redraw tables and plot anywhere
"""
import sys

from fuser.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

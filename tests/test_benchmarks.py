"""The benchmark scripts stay runnable: each runs in a small configuration on this machine (the CPU
route where there is no Hopper GPU) and prints the rows it promises."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_host_overhead_prints_every_variant_with_its_overhead():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_overhead.py"), "--rounds", "2", "--calls", "20"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = dict(re.findall(r"^  (\S+(?: \S+)?)\s+([\d.]+) us", r.stdout, re.M))
    assert set(rows) >= {"fuser.ffn", "FusedFFN", "torch.ops", "original module"} and len(rows) == 5, r.stdout
    assert r.stdout.count("overhead") == 3

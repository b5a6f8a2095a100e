"""A new user's first hour on a machine without a GPU. pip's default torch there is a CUDA build, whose
CUDA entry points raise when called (no driver) where a CPU build has none: the CPU paths (routes,
FusedFFN's kept routes, the operator, fuser.ffn's errors, optimize and report) and the demo run
under tests/driverless_cuda.py, which makes this torch behave that way. And the README says what the two
commands need and pull in."""
import os
import re
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
#: the CPU tests that reach the code deciding between CUDA and CPU paths (streams, devices, routes)
CPU_PATHS = ["test_ffn_errors.py", "test_fast_route.py", "test_optimize_structural.py", "test_custom_op.py",
             "test_optimize_report.py"]


def driverless(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.no_gpu
def test_the_simulation_raises_as_a_cuda_build_without_a_driver_does():
    code = ("import driverless_cuda, torch\n"
            "assert not torch.cuda.is_available()\n"
            "try:\n    torch._C._cuda_getCurrentRawStream(0)\nexcept torch.AcceleratorError as e:\n    print(e)\n"
            "try:\n    torch.cuda.current_stream()\nexcept RuntimeError as e:\n    print(e)\n")
    r = driverless("-c", code)
    assert r.returncode == 0, r.stderr
    assert "CUDA driver version is insufficient" in r.stdout and "Found no NVIDIA driver" in r.stdout


@pytest.mark.no_gpu
def test_cpu_paths_pass_under_a_cuda_torch_without_a_driver():
    r = driverless("-m", "pytest", "-q", "-p", "driverless_cuda", "-p", "no:cacheprovider",
                   *(os.path.join("tests", f) for f in CPU_PATHS))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "simulated: a CUDA build of torch on a machine with no NVIDIA driver" in r.stdout
    assert re.search(r"\d+ passed", r.stdout) and " failed" not in r.stdout


@pytest.mark.no_gpu
def test_demo_under_a_cuda_torch_without_a_driver():
    code = ("import sys, driverless_cuda; from fuser.tools.cli import main; "
            "sys.exit(main(['demo', '--hidden', '128', '--intermediate', '352', '--heads', '4', '--seq', '16']))")
    r = driverless("-c", code)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "result      : OK" in r.stdout and "(timing runs on a Hopper GPU only: no CUDA GPU)" in r.stdout


def test_readme_says_what_the_two_commands_need():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    assert "python -m pip install -e '.[demo]' && python -m fuser demo" in commands
    assert "python -m pip install -e '.[test]' && python -m pytest -q" in commands
    first_hour = readme[readme.index(commands):readme.index("## Status")]
    for needed in ("A C compiler and the Python headers", "about 3 GB",
                   "python -m pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu",
                   "torch==2.13.0", "torchvision must match torch"):
        assert needed in first_hour, needed

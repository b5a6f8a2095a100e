"""The build and the layout rules of ARCHITECTURE.md: the C core's unit tests (no Python), a
warning-free build under -Werror, only python/ includes Python.h, nothing includes CUDA headers, the
driver declarations match the real cuda.h, and the embedded kernel templates are the files on disk."""
import glob
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

from fuser import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler")


def files(pattern):
    return sorted(glob.glob(os.path.join(ROOT, pattern)))


@needs_cc
def test_c_unit_tests(tmp_path):
    r = subprocess.run([os.path.join(ROOT, "tests/c/run.sh")], capture_output=True, text=True,
                       env={**os.environ, "FUSER_CTEST_BIN": str(tmp_path / "ctest")}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 failures" in r.stdout


@needs_cc
@pytest.mark.parametrize("path", files("csrc/*.c") + files("python/*.c"), ids=os.path.basename)
def test_sources_compile_warning_free(path):
    flags = ["-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
             "-I" + os.path.join(ROOT, "include")]
    if "/python/" in path:
        flags.append("-I" + sysconfig.get_paths()["include"])
    r = subprocess.run([CC, *flags, path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def includes(path):
    with open(path) as f:
        return re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', f.read(), re.M)


def test_layout_rules():
    for path in files("csrc/*.c") + files("include/fuser/*.h"):
        inc = includes(path)
        assert "Python.h" not in inc, f"{path}: only python/ may include Python.h"
        assert not {"cuda.h", "nvrtc.h", "cuda_runtime.h"} & set(inc), f"{path}: CUDA is loaded with dlopen"
        assert not any(i.startswith("torch") for i in inc)
    for path in files("python/*.c"):
        assert not {"cuda.h", "nvrtc.h"} & set(includes(path))


def test_every_file_says_what_it_is_for():
    for path in files("csrc/*.c") + files("python/*.[ch]") + files("include/fuser/*.h") + \
            files("include/fuser/device/*.cuh"):
        with open(path) as f:
            head = f.read(300)
        name = os.path.basename(path)
        assert head.startswith("/* " + name + ":"), f"{path} must open with '/* {name}: <purpose>'"
    for path in files("fuser/*.py") + files("tests/test_*.py"):
        with open(path) as f:
            assert f.read(3) == '"""', f"{path} must open with a docstring"


@needs_cc
def test_driver_declarations_match_cuda_h(tmp_path):
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    inc = os.path.join(cuda_home, "include")
    if not os.path.exists(os.path.join(inc, "cuda.h")):
        pytest.skip(f"no CUDA toolkit headers at {inc} to compare against")
    r = subprocess.run([CC, "-std=c11", "-fsyntax-only", "-Werror", "-I" + os.path.join(ROOT, "include"),
                        "-I" + inc, os.path.join(ROOT, "tests/c/abi_cuda.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_embedded_headers_are_the_device_templates():
    emb = _C.embedded_headers()
    on_disk = {os.path.relpath(p, os.path.join(ROOT, "include")): p for p in files("include/fuser/device/*.cuh")}
    assert set(emb) == set(on_disk) and emb
    for name, path in on_disk.items():
        with open(path, "rb") as f:
            assert emb[name] == f.read(), f"{name} is stale: rebuild the extension"

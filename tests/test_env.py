"""fuser.env() and the lazy CUDA loader: importing needs no CUDA; what was found and exactly why the
fused path is unavailable is reported. A fake libcuda/libnvrtc (tests/c/fake_cuda.c, built here with the
C compiler) stands in for the driver so every branch runs on a CPU-only machine."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import fuser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("FUSER_", "FAKE_"))}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("needs a C compiler to build the fake driver")
    out = tmp_path_factory.mktemp("fake") / "libfakecuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), os.path.join(ROOT, "tests/c/fake_cuda.c")],
                   check=True)
    return str(out)


ENV_JSON = "import fuser, json; print(json.dumps(fuser.env().as_dict()))"


def env_with(**kw):
    return json.loads(run_py(ENV_JSON, **kw))


def test_import_needs_no_cuda():
    out = run_py("import fuser, sys; print('torch.cuda' in sys.modules, fuser.__version__)",
                 FUSER_LIBCUDA="/nonexistent/libcuda.so.1", CUDA_HOME="/nonexistent", LD_LIBRARY_PATH="")
    assert out.split()[-1] == fuser.__version__


def test_env_reports_missing_driver_and_override():
    e = env_with(FUSER_LIBCUDA="/nonexistent/libcuda.so.1")
    assert not e["fused_available"] and not e["driver_found"]
    assert "$FUSER_LIBCUDA=/nonexistent/libcuda.so.1 could not be loaded" in e["why"]
    assert e["gpu_name"] == "" and e["device_count"] == 0


def test_env_on_this_machine_says_why():
    e = fuser.env()
    assert e.fused_available or e.why
    text = str(e)
    for key in ("fused path", "GPU", "CUDA driver", "NVRTC", "kernel cache"):
        assert key in text


def test_cache_dir_follows_the_environment(tmp_path):
    assert env_with(FUSER_CACHE_DIR=str(tmp_path))["cache_dir"] == str(tmp_path)
    assert env_with(XDG_CACHE_HOME=str(tmp_path))["cache_dir"] == os.path.join(str(tmp_path), "fuser")


def test_fake_hopper_without_nvrtc(fake_cuda):
    e = env_with(FUSER_LIBCUDA=fake_cuda, FUSER_NVRTC="/nonexistent/libnvrtc.so", FAKE_CUDA_CC="90")
    assert e["driver_found"] and e["driver_path"].endswith("libfakecuda.so")
    assert e["driver_version"] == "13.0"
    assert e["gpu_name"] == "NVIDIA H200" and tuple(e["compute_capability"]) == (9, 0)
    assert e["sm_count"] == 132 and e["smem_per_block_optin"] == 232448 and e["l2_bytes"] == 62914560
    assert not e["nvrtc_found"] and "$FUSER_NVRTC=/nonexistent/libnvrtc.so" in e["why"]


def test_fake_not_hopper(fake_cuda):
    e = env_with(FUSER_LIBCUDA=fake_cuda, FUSER_NVRTC=fake_cuda, FAKE_CUDA_CC="80")
    assert "not Hopper" in e["why"] and "sm_80" in e["why"] and "A100" in e["why"]


def test_fake_no_device_and_init_failure(fake_cuda):
    e = env_with(FUSER_LIBCUDA=fake_cuda, FAKE_CUDA_COUNT="0")
    assert e["why"].startswith("no GPU")
    e = env_with(FUSER_LIBCUDA=fake_cuda, FAKE_CUDA_INIT_ERROR="100")
    assert not e["driver_found"]
    assert "failed to initialise: CUDA_ERROR_NO_DEVICE" in e["why"]


def test_fake_bad_ordinal(fake_cuda):
    out = run_py("import fuser; print(fuser.env(3).why)", FUSER_LIBCUDA=fake_cuda)
    assert "no GPU with ordinal 3" in out


def test_fake_nvrtc_found_and_too_old(fake_cuda):
    e = env_with(FUSER_LIBCUDA=fake_cuda, FUSER_NVRTC=fake_cuda, FAKE_NVRTC_VERSION="1304")
    assert e["nvrtc_found"] and e["nvrtc_version"] == "13.4" and e["nvrtc_path"].endswith("libfakecuda.so")
    e = env_with(FUSER_LIBCUDA=fake_cuda, FUSER_NVRTC=fake_cuda, FAKE_NVRTC_VERSION="1108")
    assert "NVRTC 11.8" in e["why"] and "too old" in e["why"]


def test_nvrtc_found_in_a_wheel_directory(fake_cuda, tmp_path):
    """The Python layer passes the nvidia-cuda-nvrtc wheel's lib folder to the loader."""
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    shutil.copy(fake_cuda, wheel / "libnvrtc.so.13")
    code = f"""
        import sys, json; sys.path.insert(0, {str(tmp_path / 'site')!r})
        import fuser, fuser._env as E
        print(json.dumps([E.nvrtc_wheel_dirs(), fuser.env().as_dict()]))
    """
    dirs, e = json.loads(run_py(code, FUSER_LIBCUDA=fake_cuda, CUDA_HOME="/nonexistent"))
    assert str(wheel) in dirs
    assert e["nvrtc_found"] and e["nvrtc_path"] == str(wheel / "libnvrtc.so.13")


def test_cli_env_prints():
    r = subprocess.run([sys.executable, "-m", "fuser", "env"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and "fused path" in r.stdout

"""The NVRTC JIT and the on-disk kernel cache (fuser.jit, csrc/jit.c, csrc/cache.c), on a machine with no
GPU: compiling sm_90a cluster code against the embedded headers alone, compile errors with their log,
cache hits that need no NVRTC, cache keys, corrupted entries rebuilt, concurrent writers, and a cache
that cannot be written. Tests that compile skip when NVRTC is not installed."""
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

import fuser
from fuser import _C, jit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny sm_90a kernel: cluster barrier, a DSM read of the peer block's shared memory (mapa), and a
# helper from the embedded templates. No CUDA toolkit header is reachable (see test_no_toolkit_headers).
PROBE = r"""
#include "fuser/device/common.cuh"

extern "C" __global__ void __launch_bounds__(128) fuser_probe(uint32_t *out, int n)
{
    __shared__ uint32_t buf[128];
    buf[threadIdx.x] = threadIdx.x * n;
    uint32_t rank, remote, v;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
    uint32_t local = (uint32_t)__cvta_generic_to_shared(&buf[threadIdx.x]);
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank ^ 1));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
    out[blockIdx.x * 128 + threadIdx.x] = v + fuser::ceil_div<uint32_t>(rank, 2u);
}
"""

BASE_OPTIONS = ["--gpu-architecture=sm_90a", "-std=c++17", "-default-device", "--ptxas-options=-v"]


def variant(i):
    """A different (valid) source per i."""
    return PROBE.replace("rank ^ 1", f"rank ^ {i % 2}").replace("* n;", f"* n + {i};")


def nvrtc_version():
    e = fuser.env()
    return tuple(int(x) for x in e.nvrtc_version.split(".")) if e.nvrtc_found else None


@pytest.fixture(scope="module")
def nvrtc():
    """Skip (with the reason) where NVRTC cannot be loaded."""
    version = nvrtc_version()
    if version is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc, or set $FUSER_NVRTC)")
    return version


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, private kernel cache for one test."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FUSER_CACHE_DIR", str(d))
    monkeypatch.delenv("FUSER_CACHE_DISABLE", raising=False)
    return d


def entry_path(cache_root, key):
    return os.path.join(str(cache_root), "v2", key[:2], key + ".fzk")


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def in_subprocess(code, **env):
    """Run `code` in a fresh interpreter with only these FUSER_* variables; return its JSON output."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FUSER_")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- compiling ----

def test_cluster_kernel_compiles_against_the_embedded_headers(nvrtc, cache):
    k = jit.compile_source(PROBE, "probe.cu")
    assert k.cubin[:4] == b"\x7fELF"
    used = [int(n) for n in re.findall(r"Used (\d+) registers", k.log)]
    assert used and k.registers == max(used) > 0
    assert k.spill_bytes == 0 and "0 bytes spill stores, 0 bytes spill loads" in k.log
    assert k.shared_bytes == 128 * 4  # buf[128] of uint32_t
    assert [x["name"] for x in k.kernels] == ["fuser_probe"]
    assert k.kernels[0]["registers"] == k.registers and k.kernels[0]["shared_bytes"] == 512
    assert not k.cache_hit and k.cache_state == "stored"
    assert k.key == _C.cache_key(PROBE, "probe.cu", (), nvrtc_version=nvrtc)


def test_no_toolkit_headers(nvrtc, cache):
    """NVRTC searches no include directory: only the embedded templates (and NVRTC's built-ins) exist."""
    with pytest.raises(fuser.CompileError) as e:
        jit.compile_source('#include <cuda_runtime.h>\n', "toolkit.cu")
    assert "cuda_runtime.h" in e.value.log and "no directories in search list" in e.value.log


def test_spills_are_reported(nvrtc, cache):
    src = r"""
extern "C" __global__ void spill(float *p, int n)
{
    float a[96];
#pragma unroll
    for (int j = 0; j < 96; j++) a[j] = p[j * n + threadIdx.x];
    float s = 0;
#pragma unroll
    for (int j = 0; j < 96; j++) s += a[j] * a[(j * 7) % 96];
    p[threadIdx.x] = s;
}
"""
    k = jit.compile_source(src, "spill.cu", options=("--maxrregcount=24",))
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", k.log).groups())
    assert stores > 0 and k.spill_bytes == stores + loads
    assert k.kernels[0]["spill_store_bytes"] == stores and k.registers <= 24


def test_syntax_error_raises_compile_error_with_the_log(nvrtc, cache):
    bad = 'extern "C" __global__ void broken(int *p)\n{\n    p[0] = 1\n}\n'
    with pytest.raises(fuser.CompileError) as e:
        jit.compile_source(bad, "broken.cu")
    assert 'broken.cu(4): error: expected a ";"' in e.value.log
    assert "could not compile broken.cu for sm_90a" in str(e.value)
    assert 'expected a ";"' in str(e.value)  # the message holds the start of the log too
    assert not [f for f in files_under(cache) if f.endswith(".fzk")]  # nothing cached


def test_bad_option_raises_compile_error(nvrtc, cache):
    with pytest.raises(fuser.CompileError) as e:
        jit.compile_source(PROBE, "probe.cu", options=("--no-such-option",))
    assert "--no-such-option" in e.value.log
    with pytest.raises(TypeError, match="options: expected a sequence of str"):
        _C.jit_compile(PROBE, "probe.cu", "-lineinfo")


def test_threads_compile_concurrently(nvrtc, monkeypatch):
    """NVRTC runs without the GIL; independent compiles in threads all succeed."""
    monkeypatch.setenv("FUSER_CACHE_DISABLE", "1")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: jit.compile_source(variant(i), f"t{i}.cu"), range(4)))
    assert all(r.cubin[:4] == b"\x7fELF" and r.cache_state == "disabled" for r in results)
    assert len({r.key for r in results}) == 4


# ---- cache keys (no NVRTC needed) ----

def recipe_key(source, name, options, version, headers):
    """The key recipe of include/fuser/cache.h, written again in Python."""
    parts = [b"fuser kernel cache", b"format=2", b"arch=sm_90a",
             b"nvrtc=%d.%d" % version if version else b"nvrtc=any", b"name=" + name.encode(), source.encode()]
    opts = BASE_OPTIONS + list(options)
    parts += [b"options=%d" % len(opts)] + [o.encode() for o in opts] + [b"headers=%d" % len(headers)]
    for n in sorted(headers):
        parts += [n.encode(), headers[n]]
    return hashlib.sha256(b"".join(len(p).to_bytes(8, "little") + p for p in parts)).hexdigest()


def test_cache_key_follows_its_recipe():
    headers = _C.embedded_headers()
    for args in [(PROBE, "probe.cu", (), (13, 0)), ("x", "a.cu", ("-lineinfo", "-DX=1"), (12, 9)),
                 (PROBE, "probe.cu", (), None)]:
        assert _C.cache_key(*args[:3], nvrtc_version=args[3]) == recipe_key(*args, headers)


def test_cache_key_changes_with_every_input():
    headers = _C.embedded_headers()
    base = _C.cache_key(PROBE, "probe.cu")
    assert base == _C.cache_key(PROBE, "probe.cu", (), nvrtc_version=(13, 0), headers=headers)
    edited = dict(headers, **{"fuser/device/common.cuh": headers["fuser/device/common.cuh"] + b"\n"})
    added = dict(headers, **{"fuser/device/new.cuh": b"#pragma once\n"})
    others = [
        _C.cache_key(PROBE + " ", "probe.cu"),
        _C.cache_key(PROBE, "probe2.cu"),
        _C.cache_key(PROBE, "probe.cu", ("-lineinfo",)),
        _C.cache_key(PROBE, "probe.cu", nvrtc_version=(13, 1)),
        _C.cache_key(PROBE, "probe.cu", nvrtc_version=None),
        _C.cache_key(PROBE, "probe.cu", headers=edited),
        _C.cache_key(PROBE, "probe.cu", headers=added),
    ]
    assert len(set(others + [base])) == len(others) + 1
    reordered = dict(reversed(list(added.items())))
    assert _C.cache_key(PROBE, "probe.cu", headers=reordered) == _C.cache_key(PROBE, "probe.cu", headers=added)


# ---- the disk cache ----

def test_miss_then_hit_and_a_hit_needs_no_nvrtc(nvrtc, cache):
    first = jit.compile_source(PROBE, "probe.cu")
    assert not first.cache_hit and os.path.isfile(entry_path(cache, first.key))
    second = jit.compile_source(PROBE, "probe.cu")
    assert second.cache_hit and second.cubin == first.cubin and second.log == first.log
    assert second.registers == first.registers and second.kernels == first.kernels

    code = f"""
        import json, fuser
        from fuser import jit
        hit = jit.compile_source({PROBE!r}, "probe.cu")
        try:
            jit.compile_source({variant(7)!r}, "other.cu")
            missing = None
        except fuser.CudaError as e:
            missing = str(e)
        print(json.dumps([hit.cache_hit, hit.cubin.hex(), hit.key, hit.cache_note, missing]))
    """
    hit, cubin_hex, key, note, missing = in_subprocess(code, FUSER_CACHE_DIR=str(cache),
                                                       FUSER_NVRTC="/nonexistent/libnvrtc.so")
    assert hit and bytes.fromhex(cubin_hex) == first.cubin and key == first.key
    assert "NVRTC is not available" in note
    assert missing and "$FUSER_NVRTC=/nonexistent/libnvrtc.so" in missing  # NVRTC really was missing


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_entries_are_detected_and_rebuilt(nvrtc, cache, damage):
    good = jit.compile_source(PROBE, "probe.cu")
    path = entry_path(cache, good.key)
    size = os.path.getsize(path)
    if damage == "truncate":
        os.truncate(path, size // 2)
    elif damage == "empty":
        os.truncate(path, 0)
    else:
        with open(path, "r+b") as f:
            f.seek(size - len(good.log) - 100)  # inside the CUBIN
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x40]))
    rebuilt = jit.compile_source(PROBE, "probe.cu")
    assert not rebuilt.cache_hit and rebuilt.cache_state == "stored"
    assert "invalid entry" in rebuilt.cache_note and "deleted" in rebuilt.cache_note
    assert rebuilt.cubin == good.cubin and os.path.getsize(path) == size
    again = jit.compile_source(PROBE, "probe.cu")
    assert again.cache_hit and again.cubin == good.cubin


def _compile_worker(barrier, results, source, name):
    barrier.wait(timeout=240)
    try:
        k = jit.compile_source(source, name)
        results.put((name, k.key, hashlib.sha256(k.cubin).hexdigest(), k.cubin[:4].hex(), None))
    except Exception as e:  # reported to the parent, which fails the test
        results.put((name, None, None, None, repr(e)))


def test_concurrent_processes_write_safely(nvrtc, cache):
    """8 processes released at once on a cold cache: 4 compile and store the same key, 4 different ones."""
    ctx = multiprocessing.get_context("spawn")
    jobs = [(PROBE, "same.cu")] * 4 + [(variant(i), f"v{i}.cu") for i in range(4)]
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_compile_worker, args=(barrier, results) + job) for job in jobs]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [g[4] for g in got] == [None] * len(jobs)
    assert all(g[3] == "7f454c46" for g in got)
    same = {(g[1], g[2]) for g in got if g[0] == "same.cu"}
    assert len(same) == 1  # one key, one binary
    keys = {g[1] for g in got}
    assert len(keys) == 5
    names = files_under(cache)
    assert sorted(n for n in names if n.endswith(".fzk")) == sorted(f"v2/{k[:2]}/{k}.fzk" for k in keys)
    assert not [n for n in names if os.path.basename(n).startswith(".")], names  # no temporary files
    for source, name in jobs:  # every entry left behind is valid
        assert jit.compile_source(source, name).cache_hit


def test_unwritable_cache_still_compiles(nvrtc, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FUSER_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="could not store it in the kernel cache"):
        k = jit.compile_source(PROBE, "probe.cu")
    assert k.cubin[:4] == b"\x7fELF" and k.cache_state == "not_stored" and not k.cache_hit
    assert "cannot create the cache directory" in k.cache_note
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("FUSER_CACHE_DIR", str(ro))
        with pytest.warns(RuntimeWarning):
            assert jit.compile_source(PROBE, "probe.cu").cache_state == "not_stored"
        assert files_under(ro) == []


def test_cache_disable(nvrtc, cache, monkeypatch):
    monkeypatch.setenv("FUSER_CACHE_DISABLE", "1")
    for _ in range(2):
        k = jit.compile_source(PROBE, "probe.cu")
        assert k.cache_state == "disabled" and not k.cache_hit and k.cubin[:4] == b"\x7fELF"
    assert not cache.exists()
    monkeypatch.setenv("FUSER_CACHE_DISABLE", "0")
    assert jit.compile_source(PROBE, "probe.cu").cache_state == "stored"


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSER_CACHE_DIR", str(tmp_path))
    assert jit.cache_dir() == str(tmp_path) == fuser.env().cache_dir


def test_readme_example_runs(nvrtc, cache):
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = re.search(r"### Compiling kernels.*?```python\n(.*?)```", text, re.S).group(1)
    scope = {}
    exec(block, scope)
    k = scope["k"]
    assert k.cubin[:4] == b"\x7fELF" and k.kernels[0]["name"] == "fill" and k.spill_bytes == 0
    assert jit.compile_source(scope["src"], "fill.cu").cache_hit


def test_every_compile_reports_registers(nvrtc, cache, monkeypatch):
    """The same program compiled again in one process still comes back with ptxas's report. Where a
    driver is loaded, NVRTC 12.9+ caches programs in-process and returned the second one without it
    (registers and spills read 0 on the H200): fuser passes --no-cache. Here with the disk cache off;
    the GPU run below repeats it with the driver loaded."""
    monkeypatch.setenv("FUSER_CACHE_DISABLE", "1")
    ks = [jit.compile_source(PROBE, "probe.cu") for _ in range(3)]
    assert all(k.registers > 0 and k.kernels and k.kernels[0]["name"] == "fuser_probe" for k in ks)
    assert len({k.registers for k in ks}) == 1


@pytest.mark.gpu
def test_every_compile_reports_registers_with_the_driver_loaded(nvrtc, cache, monkeypatch):
    import torch
    torch.zeros(1, device="cuda")   # the driver and a context, as in any real process
    test_every_compile_reports_registers(nvrtc, cache, monkeypatch)


@pytest.mark.gpu
def test_probe_launches_with_clusters_on_hopper(nvrtc, cache, tmp_path):
    """launch.c on a real GPU: clusters of 2, 8 and 16 (non-portable) blocks, >48 KB dynamic smem."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    cubin = tmp_path / "probe.cubin"
    cubin.write_bytes(jit.compile_source(PROBE, "probe.cu").cubin)
    exe = tmp_path / "gpu_probe"
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "*.c")))
    subprocess.run([cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
                    "-I" + os.path.join(ROOT, "include"), *sources, os.path.join(ROOT, "tests/c/embedded_fixture.c"),
                    os.path.join(ROOT, "tests/c/gpu_probe.c"), "-o", str(exe), "-ldl", "-lpthread", "-lm"],
                   check=True)
    r = subprocess.run([str(exe), str(cubin)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == 3


def test_generated_kernels_call_no_math_subroutines():
    """Every activation, plain and gated, compiles to straight-line math: no CUDA math slow-path
    subroutine (the IEEE-division slow path of a naive SiLU clobbered live registers on an H200).
    fuser.compile refuses such a kernel; this checks the templates never produce one."""
    if not fuser.env().nvrtc_found:
        pytest.skip("needs NVRTC (pip install nvidia-cuda-nvrtc)")
    from fuser import runtime
    for act in ("relu", "gelu", "gelu_tanh", "silu"):
        for gated in (False, True):
            p = fuser.plan(64, 256, 1024, gated=gated, activation=act, target="h200", fused=True)
            k = fuser.compile(p)
            assert not any(tag in k.cubin for tag in runtime.MATH_SUBROUTINES), (act, gated)
            assert k.spill_bytes == 0

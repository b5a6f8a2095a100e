"""The kernel cache against what could block it, fool it or plant code in it, and the boolean
environment variables, each in a fresh interpreter with a cache directory of the test's own: a FIFO
or a symbolic link in place of an entry (no hang, never followed), an entry relabelled with another
plan's key and a recomputed checksum (not served), a cache directory that another user owns or that
others may write (refused with one warning; kernels still compile, in memory), the default directory
without $HOME, a path too long (an error, not a cut), and 1/0, true/false, yes/no, on/off.
Compiling needs NVRTC (the nvidia-cuda-nvrtc wheel), not a GPU; those tests skip without it."""
import glob
import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

import conftest
import fuser
from fuser import _C, interop, jit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_UID = 4242  # a user that is not this one
HANG_S = 60       # a compile that takes longer than this is hung (a plan compiles in well under a second)

# plan A and plan B (another kernel), as a subprocess builds them
PLANS = """
import fuser
A = fuser.plan(64, 256, 1024, activation="relu", target="h200", fused=True)
B = fuser.plan(64, 256, 1024, activation="silu", target="h200", fused=True)
"""


def run(code, timeout=HANG_S, **env):
    """Run PLANS then `code`, which fills the dict `res`, in a fresh interpreter with only these FUSER_*
    variables (and these others; a value None removes one); return `res`. A run past `timeout` fails
    the test as a hang."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FUSER_")}
    e.update(env)
    e = {k: v for k, v in e.items() if v is not None}
    program = PLANS + "import json\nres = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(res))\n"
    try:
        r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=e, cwd=ROOT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fuser hung: no answer after {timeout} s")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# compile plan A twice; res: how the first went, and the RuntimeWarnings of both
COMPILE = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ks = [fuser.compile(A) for _ in range(2)]
res.update(hit=ks[0].cache_hit, state=ks[0].compiled.cache_state, note=ks[0].compiled.cache_note,
           elf=ks[0].cubin[:4] == b"\\x7fELF" and ks[1].cubin == ks[0].cubin, key=ks[0].key, source=ks[0].source,
           cubin=ks[0].cubin.hex(), warnings=[str(w.message) for w in caught if w.category is RuntimeWarning])
"""


@pytest.fixture(scope="module")
def nvrtc():
    if not fuser.env().nvrtc_found:
        pytest.skip("needs NVRTC (pip install nvidia-cuda-nvrtc)")


def entry(root, key, version=None):
    """The entry file of `key` under root: of format `version`, else the one there is."""
    if version is None:
        (found,) = glob.glob(os.path.join(str(root), "v*", key[:2], key + ".fzk"))
        return found
    return os.path.join(str(root), f"v{version}", key[:2], key + ".fzk")


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# ---- entries that could block or be followed ----

def test_a_fifo_in_place_of_an_entry_does_not_hang(nvrtc, tmp_path):
    cache = str(tmp_path / "cache")
    first = run(COMPILE, FUSER_CACHE_DIR=cache)
    path = entry(cache, first["key"])
    os.unlink(path)
    os.mkfifo(path)
    again = run(COMPILE, FUSER_CACHE_DIR=cache)  # opening the FIFO must not wait for a writer
    assert not again["hit"] and again["state"] == "stored" and again["elf"]
    assert "not a regular file" in again["note"] and again["cubin"] == first["cubin"]
    assert stat.S_ISREG(os.lstat(path).st_mode)  # the store replaced the FIFO
    assert run(COMPILE, FUSER_CACHE_DIR=cache)["hit"]


def test_a_symbolic_link_in_place_of_an_entry_is_not_followed(nvrtc, tmp_path):
    cache = str(tmp_path / "cache")
    first = run(COMPILE, FUSER_CACHE_DIR=cache)
    path, elsewhere = entry(cache, first["key"]), str(tmp_path / "elsewhere.fzk")
    os.rename(path, elsewhere)  # a valid entry of this very key, outside the cache, reached by a link
    os.symlink(elsewhere, path)
    again = run(COMPILE, FUSER_CACHE_DIR=cache)
    assert not again["hit"] and again["state"] == "stored" and "a symbolic link" in again["note"]
    assert stat.S_ISREG(os.lstat(path).st_mode) and os.path.isfile(elsewhere)  # the link replaced, not its target


def test_store_files_are_opened_without_blocking(tmp_path):
    """The per-GPU JSON files beside the kernels (calibration, tuned plans) are read the same way."""
    cache = tmp_path / "cache"
    (cache / "calibration").mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    os.mkfifo(cache / "calibration" / "x.json")
    code = """
        import warnings
        from fuser import store
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res["got"] = store.load("calibration", "x")
        res["warned"] = [str(w.message) for w in caught]
    """
    got = run(code, FUSER_CACHE_DIR=str(cache))
    assert got["got"] == {} and len(got["warned"]) == 1 and "not a regular file" in got["warned"][0]


# ---- origin: a relabelled entry ----

def test_a_relabelled_entry_is_not_served(nvrtc, tmp_path):
    """Plan A's entry rewritten as plan B's: B's key in the header, the checksum recomputed as format 1
    made it (SHA-256 of header bytes [0, 224), the CUBIN and the log). Anyone able to write the file can do
    that; it must not make fuser serve A's kernel for plan B. The MAC under the cache's secret refuses it."""
    cache = str(tmp_path / "cache")
    code = COMPILE.replace("fuser.compile(A)", "fuser.compile(B)")
    b = run(code, FUSER_CACHE_DIR=cache)
    a = run(COMPILE, FUSER_CACHE_DIR=cache)
    data = bytearray(open(entry(cache, a["key"]), "rb").read())
    data[64:128] = b["key"].encode()
    data[128:192] = _C.cache_key(b["source"], "fuser_ffn.cu", (), nvrtc_version=None).encode()
    data[224:256] = hashlib.sha256(bytes(data[:224]) + bytes(data[256:])).digest()
    with open(entry(cache, b["key"]), "wb") as f:
        f.write(data)
    again = run(code, FUSER_CACHE_DIR=cache)
    assert not again["hit"] and again["cubin"] == b["cubin"] != a["cubin"]  # B's own kernel, rebuilt
    assert "invalid entry" in again["note"] and "MAC mismatch" in again["note"]


def test_entries_carry_the_documented_mac(nvrtc, tmp_path):
    """cache.h's format: HMAC-SHA256 under <root>/v2/secret (32 bytes, mode 0600) of header bytes
    [0, 224), the CUBIN and the log, at bytes [224, 256); directories 0700, entries 0600."""
    cache = tmp_path / "cache"
    a = run(COMPILE, FUSER_CACHE_DIR=str(cache))
    secret_path = cache / "v2" / "secret"
    secret = secret_path.read_bytes()
    data = open(entry(cache, a["key"], 2), "rb").read()
    assert len(secret) == 32 and data[8] == 2
    assert hmac.new(secret, data[:224] + data[256:], hashlib.sha256).digest() == data[224:256]
    assert data[64:128] == a["key"].encode()
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(entry(cache, a["key"])).st_mode) == 0o600
    assert {stat.S_IMODE(os.stat(cache / d).st_mode) for d in ("", "v2", "v2/" + a["key"][:2])} == {0o700}


# ---- the directory: owner and permissions ----

def _make_unsafe(path, kind):
    if kind == "another user's":
        try:
            os.chown(path, OTHER_UID, OTHER_UID)
        except PermissionError:
            pytest.skip("chown to another user needs root")
    else:
        os.chmod(path, {"writable by others": 0o777, "writable by group": 0o770, "sticky like /tmp": 0o1777}[kind])


@pytest.mark.parametrize("kind", ["writable by others", "writable by group", "sticky like /tmp", "another user's"])
def test_an_unsafe_cache_directory_is_refused(nvrtc, tmp_path, kind):
    """A cache fuser would serve (a warm copy, secret included) planted in a directory that is not
    private to this user: not read, not written, one warning; the kernel still compiles."""
    warm = tmp_path / "warm"
    a = run(COMPILE, FUSER_CACHE_DIR=str(warm))
    planted = tmp_path / "planted"
    shutil.copytree(warm, planted)
    _make_unsafe(planted, kind)
    before = files_under(planted)
    code = COMPILE + """
from fuser import store
try:
    store.save("tuned", "x", {})
    res["saved"] = "saved"
except fuser.CacheError as e:
    res["saved"] = str(e)
res.update(loaded=store.load("calibration", "x"), env_text=str(fuser.env()))
"""
    got = run(code, FUSER_CACHE_DIR=str(planted))
    why = "is owned by uid 4242, not by this user" if kind == "another user's" else "writable by group or others"
    assert not got["hit"] and got["state"] == "refused" and got["elf"] and got["cubin"] == a["cubin"]
    assert why in got["note"] and str(planted) in got["note"] and "$FUSER_CACHE_DIR" in got["note"]
    assert len(got["warnings"]) == 1 and why in got["warnings"][0]  # once, for two compiles
    assert got["loaded"] == {} and why in got["saved"] and why in got["env_text"]
    assert files_under(planted) == before  # nothing written


def test_a_symbolic_link_of_another_user_in_place_of_the_directory_is_refused(nvrtc, tmp_path):
    """A link planted in a shared directory (e.g. /tmp/fuser-<uid> -> a directory of the victim's)."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert run(COMPILE, FUSER_CACHE_DIR=str(link))["state"] == "stored"  # a link of this user's is followed
    try:
        os.lchown(link, OTHER_UID, OTHER_UID)
    except PermissionError:
        pytest.skip("lchown to another user needs root")
    got = run(COMPILE, FUSER_CACHE_DIR=str(link))
    assert got["state"] == "refused" and "symbolic link owned by uid 4242" in got["note"]


def test_the_cache_directory_is_made_private(nvrtc, tmp_path):
    cache = tmp_path / "new" / "cache"
    assert run(COMPILE, FUSER_CACHE_DIR=str(cache))["state"] == "stored"
    assert stat.S_IMODE(os.stat(cache).st_mode) == stat.S_IMODE(os.stat(cache.parent).st_mode) == 0o700


def test_the_default_directory_without_home_is_this_users_own(nvrtc, tmp_path):
    """With HOME, XDG_CACHE_HOME and FUSER_CACHE_DIR unset: $TMPDIR/fuser-<uid> (or /tmp/fuser-<uid>), not
    a shared /tmp/.cache/fuser; made 0700, and refused when it is not private."""
    env = dict(HOME=None, XDG_CACHE_HOME=None, TMPDIR=str(tmp_path))
    want = str(tmp_path / f"fuser-{os.geteuid()}")
    where = run("from fuser import jit\nres.update(jit=jit.cache_dir(), env=fuser.env().cache_dir)", **env)
    assert where == {"jit": want, "env": want}  # checked before anything is compiled there
    assert run(COMPILE, **env)["state"] == "stored"
    assert stat.S_IMODE(os.stat(want).st_mode) == 0o700
    os.chmod(want, 0o777)  # as another user could have made it first, in a shared /tmp
    got = run(COMPILE, **env)
    assert got["state"] == "refused" and "(from $TMPDIR/fuser-<uid>)" in got["note"] and got["elf"]


def test_a_path_too_long_is_an_error_not_a_cut(nvrtc, tmp_path):
    long_dir = str(tmp_path.joinpath(*["d" * 200] * 6))  # 1,200+ bytes in names the file system takes
    code = COMPILE + """
from fuser import jit
try:
    res["where"] = jit.cache_dir()
except fuser.CacheError as e:
    res["where"] = "CacheError: " + str(e)
res.update(shown=fuser.env().cache_dir, env_text=str(fuser.env()))
"""
    got = run(code, FUSER_CACHE_DIR=long_dir)
    size = f"from $FUSER_CACHE_DIR is {len(long_dir)} bytes long"
    assert got["where"].startswith("CacheError: ") and size in got["where"]
    assert got["shown"] == "" and size in got["env_text"]  # env() shows no cut path, but why there is none
    assert got["state"] == "refused" and got["elf"] and size in got["note"] and len(got["warnings"]) == 1
    assert os.listdir(tmp_path) == []  # nothing made at the cut path


# ---- boolean variables ----

TINY = 'extern "C" __global__ void tiny(float *p) { p[threadIdx.x] = 2.0f; }'


@pytest.mark.parametrize("value, off", [("1", True), ("true", True), ("YES", True), ("On", True),
                                        ("0", False), ("false", False), ("No", False), ("OFF", False), ("", False)])
def test_cache_disable_spellings(nvrtc, tmp_path, monkeypatch, value, off):
    monkeypatch.setenv("FUSER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSER_CACHE_DISABLE", value)
    k = jit.compile_source(TINY, "tiny.cu")
    assert k.cache_state == ("disabled" if off else "stored")
    assert ("off (disabled by $FUSER_CACHE_DISABLE)" in str(fuser.env())) is off


@pytest.mark.parametrize("value", ["maybe", "2", "flase", " 1", "y"])
def test_a_boolean_variable_with_another_value_is_an_error(monkeypatch, value):
    monkeypatch.setenv("FUSER_CACHE_DISABLE", value)
    monkeypatch.setenv("FUSER_DISABLE", value)
    want = f"='{value}' is not a boolean: use 1/0, true/false, yes/no or on/off"
    with pytest.raises(ValueError, match=re.escape("$FUSER_CACHE_DISABLE" + want)):
        jit.compile_source(TINY, "tiny.cu")  # before NVRTC is looked for
    with pytest.raises(ValueError, match=re.escape("$FUSER_DISABLE" + want)):
        interop.disabled()
    assert "$FUSER_CACHE_DISABLE" + want in str(fuser.env())  # env() reports, never raises


@pytest.mark.parametrize("value, off", [("1", True), ("TRUE", True), ("yes", True), ("on", True),
                                        ("0", False), ("false", False), ("no", False), ("Off", False), ("", False)])
def test_fuser_disable_spellings(monkeypatch, value, off):
    monkeypatch.setenv("FUSER_DISABLE", value)
    assert interop.disabled() is off
    monkeypatch.delenv("FUSER_DISABLE")
    assert interop.disabled() is False


# ---- the test suite itself ----

def test_the_suite_uses_a_temporary_kernel_cache():
    """conftest.py points FUSER_CACHE_DIR at a temporary directory before fuser is imported, so that the
    suite never writes into the user's ~/.cache/fuser, unless the run set one on purpose."""
    assert os.environ.get("FUSER_CACHE_DIR")
    assert jit.cache_dir() != os.path.join(os.path.expanduser("~"), ".cache", "fuser")
    if conftest.TEST_CACHE:
        assert jit.cache_dir() == conftest.TEST_CACHE and os.path.isdir(conftest.TEST_CACHE)

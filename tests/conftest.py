"""Shared test helpers: a kernel cache of the test run's own, the Hopper-GPU gate and fresh random
inputs."""
import functools
import os
import shutil
import tempfile

# The kernel cache of this test run: a temporary directory, set before fuser is imported, so that the
# suite never writes kernels into the user's own ~/.cache/fuser. Subprocesses inherit it; tests that
# need a cache of their own set FUSER_CACHE_DIR themselves. A FUSER_CACHE_DIR already set (a GPU
# session keeping warm kernels between runs) is kept.
if not os.environ.get("FUSER_CACHE_DIR"):
    os.environ["FUSER_CACHE_DIR"] = TEST_CACHE = tempfile.mkdtemp(prefix="fuser-test-cache-")
else:
    TEST_CACHE = None

import pytest  # noqa: E402
import torch  # noqa: E402

from fuser.tools import timing  # noqa: E402


def pytest_unconfigure(config):
    if TEST_CACHE:
        shutil.rmtree(TEST_CACHE, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def hopper_reason():
    """None when a Hopper GPU is present, else why not (the skip reason; what the tools say too)."""
    return timing.hopper_reason()


def pytest_collection_modifyitems(config, items):
    reason = hopper_reason()
    skips = {}   # marker -> why its tests cannot run here
    if reason is not None:
        skips["gpu"] = f"needs an NVIDIA Hopper GPU: {reason}"
    if torch.cuda.is_available():
        skips["no_gpu"] = "asserts what a machine without a CUDA device does (the CI's); this one has one"
    for item in items:
        for marker, why in skips.items():
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))


def rel_error(y, ref):
    """||y - ref|| / ||ref|| in float64; NaN anywhere gives NaN (which fails every bound)."""
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


class CudaLooking(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` says True, every op that of a plain tensor (``x.as_subclass(CudaLooking)``):
    the eager route's steps taken for CUDA inputs only (the up GEMM's cuBLASLt epilogue, the zero bias) then run
    on the CPU's ops, ``torch._addmm_activation`` among them, so that CI checks their C paths."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


@pytest.fixture
def op_calls(monkeypatch):
    """A list that records the activation of every call that takes fuser's general route
    (``fuser.ops.route``) or the operator's shortcut to a route kept for its key (``fuser.ops.run_kept``
    finding one): each call of the ``fuser::ffn`` operator's implementation, and each ``FusedFFN``
    call its kept route does not serve. A test can tell from it that fuser, not the original module,
    computed an output, and how often a shape was routed rather than kept."""
    import fuser.ops
    calls = []
    real_route, real_kept = fuser.ops.route, fuser.ops.run_kept

    def counting(x, *args, **kw):
        calls.append(kw.get("activation", args[-1] if len(args) == 7 else "gelu"))
        return real_route(x, *args, **kw)

    def counting_kept(x, *args):
        y = real_kept(x, *args)
        if y is not None:
            calls.append(args[-1])
        return y

    monkeypatch.setattr(fuser.ops, "route", counting)
    monkeypatch.setattr(fuser.ops, "run_kept", counting_kept)
    return calls


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters cleared before and after a test (graph-break counts are per test)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fake_cuda():
    """The CUDA predicates the C core reads at each call (``_C.gate_setup``'s current device, raw stream and
    capture), faked for CPU tensors: {"device": the current device (0), "stream": its raw stream (7),
    "capturing": False}, which a test may change; the real predicates are registered again after it. For tests
    of the C paths that launch kept or prepared kernels, with a recording launch in place of the kernel's."""
    from fuser import _C, interop, runtime
    from fuser.reference import ACTIVATIONS
    if _C.tensor_intake()["version"] is None:
        pytest.skip("this torch has no DLPack C exchange API (kept launches are then checked in Python)")
    state = {"device": 0, "stream": 7, "capturing": False}
    _C.gate_setup(runtime.gate_cubin, tuple(ACTIVATIONS[a] for a in runtime.GATE_ACTS), lambda: state["capturing"],
                  torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled,
                  lambda: state["device"], lambda device: state["stream"] if device == 0 else -1,
                  interop.disabled, torch.is_grad_enabled, None, (None,) * 4, None)
    yield state
    runtime.register_eager_hooks()


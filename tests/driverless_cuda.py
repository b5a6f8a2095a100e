"""A pytest plugin (``-p driverless_cuda``, with tests/ on ``sys.path``) that makes this torch behave as a
CUDA build of torch does on a machine with no NVIDIA driver: what pip installs by default on a fresh
CPU-only machine. There ``torch.cuda.is_available()`` is False, as with a CPU build, but torch's CUDA
entry points exist and raise when called, where a CPU build lacks them (so code that never calls them
on a CPU build may still call them on a CUDA build). Imported before fuser, it replaces:

- ``torch._C._cuda_getCurrentRawStream`` and ``torch._C._cuda_getDevice`` (absent from CPU builds) with
  functions raising ``torch.AcceleratorError("CUDA driver version is insufficient ...")``;
- ``torch.cuda._lazy_init`` (behind ``current_stream``, ``current_device``, ``get_device_capability``,
  ``Stream``, ``Event``, ``synchronize``...) with one raising torch's no-driver RuntimeError;
- ``torch.version.cuda`` with a CUDA version.
"""
import torch

DRIVER = "CUDA error: CUDA driver version is insufficient for CUDA runtime version"


def _insufficient_driver(*args, **kwargs):
    raise torch.AcceleratorError(DRIVER)


def _no_driver(*args, **kwargs):
    raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                       "installed a driver from http://www.nvidia.com/Download/index.aspx")


torch.version.cuda = "13.0"
torch._C._cuda_getCurrentRawStream = _insufficient_driver
torch._C._cuda_getDevice = _insufficient_driver
torch.cuda._lazy_init = _no_driver


def pytest_terminal_summary(terminalreporter):
    assert not torch.cuda.is_available()
    terminalreporter.write_line("simulated: a CUDA build of torch on a machine with no NVIDIA driver "
                                "(tests/driverless_cuda.py)")

"""The documentation runs: every docstring example in the fuser package (doctest), and every Python
block of the README, in order, each in a fresh namespace."""
import doctest
import importlib
import os
import pkgutil
import re

import pytest

import fuser
import models  # noqa: F401  (makes transformers importable beside CI's CPU torch)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(m.name for m in pkgutil.walk_packages(fuser.__path__, "fuser.") if m.name != "fuser.__main__")


@pytest.mark.parametrize("name", ["fuser"] + MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_every_public_function_has_an_example():
    missing = []
    for name in ["fuser"] + MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if callable(obj) and not isinstance(obj, type(fuser.FuserError)) and ">>>" not in (obj.__doc__ or ""):
                missing.append(f"{name}.{attr}")
    assert not [m for m in missing if not m.endswith(("Error", "Env"))], missing


def readme_blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_python_blocks(index):
    block = readme_blocks()[index]
    if "compile_source(" in block and not fuser.env().nvrtc_found:
        pytest.skip("this block compiles CUDA: needs NVRTC (pip install nvidia-cuda-nvrtc)")
    exec(compile(block, f"README.md[python block {index}]", "exec"), {})

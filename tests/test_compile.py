"""torch.compile: optimized models trace with fullgraph=True and no graph break (counted with torch's
own tooling), and the "fuser" backend rewrites FFNs of unoptimized models into fuser::ffn (asserted on
the rewritten graph), runs under Inductor, trains, and is registered both through the entry point and
on import, safely more than once."""
import copy
import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import fuser
import fuser.backend
from models import assert_same_grads, hf, output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FFN_OPS = (torch.ops.fuser.ffn, torch.ops.fuser.ffn.default)   # Dynamo records the packet


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def graph_breaks():
    return sum(torch._dynamo.utils.counters["graph_break"].values())


class Capture:
    """A backend that runs the fuser backend with an eager inner compiler and keeps the graphs."""

    def __init__(self, inner="eager"):
        self.graphs, self.inner = [], inner

    def __call__(self, gm, example_inputs):
        compiled = fuser.backend.fuser_backend(gm, example_inputs, inner=self.inner)
        self.graphs.append(gm)
        return compiled

    def op_count(self):
        return sum(n.target in FFN_OPS for gm in self.graphs for n in gm.graph.nodes)


@pytest.mark.parametrize("name", ["llama", "phi3", "gpt2", "bert", "t5"])
def test_optimized_model_fullgraph_no_graph_breaks(name, op_calls):
    model, inputs = hf(name)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    explained = torch._dynamo.explain(model)(**inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()
    seen = []

    def keep(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=keep)
    with torch.no_grad():
        torch.testing.assert_close(output(compiled, inputs), output(ref, inputs), rtol=1e-5, atol=1e-5)
    assert graph_breaks() == 0
    assert sum(n.target in FFN_OPS for n in seen[0].graph.nodes) == len(fuser.report(model).fused)


def test_optimized_model_under_inductor(op_calls):
    model, inputs = hf("llama")
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(output(compiled, inputs), output(ref, inputs), rtol=1e-5, atol=1e-5)
    assert graph_breaks() == 0 and op_calls


@pytest.mark.parametrize("name,count", [("llama", 2), ("gpt_neox", 2), ("bert", 2), ("qwen3", 2)])
def test_backend_inserts_fused_op(name, count, op_calls):
    model, inputs = hf(name)
    capture = Capture()
    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        y = output(compiled, inputs)
        torch.testing.assert_close(y, output(model, inputs), rtol=1e-5, atol=1e-5)
    assert capture.op_count() == count and graph_breaks() == 0
    assert len(op_calls) == count
    linears_left = [n for gm in capture.graphs for n in gm.graph.nodes if n.target is torch._C._nn.linear]
    assert linears_left   # attention projections and the LM head stay as they were


def test_backend_on_sequential_patterns():
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(approximate="tanh"), nn.Dropout(0.0), nn.Linear(64, 16),
                          nn.LayerNorm(16), nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 16))
    capture = Capture()
    x = torch.randn(3, 16)
    torch.testing.assert_close(torch.compile(model, backend=capture)(x), model(x), rtol=1e-5, atol=1e-5)
    acts = [n.args[-1] for gm in capture.graphs for n in gm.graph.nodes if n.target in FFN_OPS]
    assert acts == ["gelu_tanh", "relu"] or sorted(acts) == ["gelu_tanh", "relu"]


def test_backend_leaves_unsupported_alone():
    model = nn.Sequential(nn.Linear(16, 64), nn.Mish(), nn.Linear(64, 16)).double()
    capture = Capture()
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.compile(model, backend=capture)(x)
    assert capture.op_count() == 0


def test_backend_by_name_under_inductor(op_calls):
    model, inputs = hf("llama")
    compiled = torch.compile(copy.deepcopy(model), backend="fuser")
    with torch.no_grad():
        torch.testing.assert_close(output(compiled, inputs), output(model, inputs), rtol=1e-5, atol=1e-5)
    assert graph_breaks() == 0 and op_calls == ["silu", "silu"]


def test_backend_training_gradients_match(op_calls):
    model, inputs = hf("llama")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=functools.partial(fuser.backend.fuser_backend, inner="aot_eager"))
    output(compiled, inputs).square().mean().backward()
    output(ref, inputs).square().mean().backward()
    assert op_calls
    assert_same_grads(model, ref)


def test_optimized_model_compiled_training_gradients_match():
    model, inputs = hf("gpt2")
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    output(compiled, inputs).square().mean().backward()
    output(ref, inputs).square().mean().backward()
    assert_same_grads(model, ref)
    assert graph_breaks() == 0


def run_py(code):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


COMPILE_MLP = """
    import torch
    from torch import nn
    mlp = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 16))
    x = torch.randn(2, 16)
    torch.testing.assert_close(torch.compile(mlp, backend="fuser")(x), mlp(x))
    print("ok", "fuser" in torch._dynamo.list_backends())
"""


def test_backend_found_through_entry_point_without_import():
    out = run_py("import sys\n" + textwrap.dedent(COMPILE_MLP) + "print('fuser.backend' in sys.modules)")
    assert out.split() == ["ok", "True", "True"]


def test_backend_registered_on_import_and_reimport_is_safe():
    # entry points hidden: only the registration done by importing fuser.backend can find it
    out = run_py(textwrap.dedent("""
        import importlib, importlib.metadata
        real = importlib.metadata.entry_points
        importlib.metadata.entry_points = lambda **kw: real(**kw) if kw.get("group") != "torch_dynamo_backends" \
            else importlib.metadata.EntryPoints([])
        import torch
        assert "fuser" not in torch._dynamo.list_backends(exclude_tags=())
        import fuser.backend
        importlib.reload(fuser.backend)
        importlib.reload(fuser.backend)
    """) + textwrap.dedent(COMPILE_MLP))
    assert out.split() == ["ok", "True"]

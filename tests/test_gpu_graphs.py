"""CUDA graphs of fused calls: graphs of several shapes in one process (a server capturing a graph per batch
size), and the timing tools' graphs keeping what they read alive."""
import gc
import os
import subprocess
import sys
import weakref

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = os.path.join(os.path.dirname(__file__), "gpu", "graphs_of_shapes.py")


def test_graphs_of_several_shapes_replay_in_any_order():
    # decode shapes of two models, a 16-token shape and a small model: several kernels sharing one scratch,
    # each graph replayed after the others were captured and replayed; in a process of its own, since an
    # illegal address would leave this one's CUDA context unusable
    r = subprocess.run([sys.executable, SCRIPT, "llama2-7b:1", "llama3-8b:1", "llama2-7b:16", "gpt2:1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_graphed_replay_keeps_what_its_function_reads():
    import torch

    from fuser.tools.timing import graphed

    def make():
        a = torch.zeros(1 << 20, device="cuda")
        replay, _ = graphed(lambda: a.add_(1), 2)
        return replay, weakref.ref(a)
    replay, alive = make()
    gc.collect()
    torch.cuda.empty_cache()
    assert alive() is not None            # the tensor the graph writes outlives the function that made it
    before = alive()[0].item()
    replay()
    torch.cuda.synchronize()
    assert alive()[0].item() == before + 2

"""FusedFFN's kept eager route (fuser/module.py): after a shape's first call, later calls skip re-reading
the weights and the route lookup, yet every change a user can make is seen: weights updated in place,
`.data` replaced, a new Parameter, a new shape, autograd. (The kept fused launch needs a Hopper GPU:
tests/test_gpu_torch.py.)"""
import copy

import pytest
import torch
from torch import nn

import fuser
from fuser.module import FusedFFN
from models import hf


def kept_eager(module):
    """The route `module` keeps for its last input shape, checked to be the eager ops."""
    kept = module.__dict__["_kept"]
    assert not kept.route.fused
    return kept


def reference(module, x):
    w = module.weights()
    return fuser.ffn_reference(x, w["up"], w["down"], w_gate=w["gate"], b_up=w["b_up"], b_gate=w["b_gate"],
                               b_down=w["b_down"], activation=module.spec.activation)


def test_second_call_keeps_the_route_and_sees_every_weight_change():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16))
    m = FusedFFN.from_module(mlp)
    x = torch.randn(5, 16)
    with torch.no_grad():
        m(x)
        torch.testing.assert_close(m(x), reference(m, x))
        kept = kept_eager(m)
        mlp[0].weight.mul_(-2)                                       # in place: the kept route sees it
        torch.testing.assert_close(m(x), reference(m, x))
        assert m.__dict__["_kept"] is kept
        mlp[2].weight.data = torch.randn(16, 48)                     # .data replaced: rebuilt
        torch.testing.assert_close(m(x), reference(m, x))
        assert m.__dict__["_kept"] is not kept
    mlp[2].bias = nn.Parameter(torch.randn(16))                      # a new Parameter: rebuilt
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference(m, x))
        x2 = torch.randn(2, 3, 16)                                   # a new shape: the general route
        torch.testing.assert_close(m(x2), reference(m, x2))
    y = m(x)                                                         # autograd through the kept route
    y.sum().backward()
    assert mlp[0].weight.grad is not None and mlp[0].weight.grad.abs().sum() > 0


def test_sliced_gate_up_weight_replaced_is_seen():
    """Phi-3 keeps gate and up in one Parameter, sliced by rows at every general call: the kept slices
    would be stale views if the Parameter's data were replaced, so the address is checked."""
    model, inputs = hf("phi3")
    model.eval()
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    mlp = next(mod for mod in model.modules() if isinstance(mod, FusedFFN))
    x = torch.randn(3, mlp.spec.d_model)
    with torch.no_grad():
        mlp(x)
        mlp(x)
        kept_eager(mlp)
        gu = mlp.get_submodule("gate_up_proj").weight
        gu.data = torch.randn_like(gu) * 0.1
        torch.testing.assert_close(mlp(x), reference(mlp, x))
        assert not torch.allclose(model(**inputs).logits, ref(**inputs).logits)   # the new weights were used


def test_kept_route_is_not_used_while_compiling():
    """Under torch.compile the op stays in the graph: the kept route is not consulted (no guard on it)."""
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(16, 48), nn.SiLU(), nn.Linear(48, 16))).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        m(x)
        m(x)
        kept_eager(m)
        from torch._dynamo.utils import counters
        counters.clear()
        y = torch.compile(m, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(y, reference(m, x))
    assert not counters["graph_break"]


@pytest.mark.parametrize("bad", [None, "string"])
def test_kept_route_declines_what_the_general_route_must_judge(bad):
    torch.manual_seed(0)
    m = FusedFFN.from_module(nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8)))
    with torch.no_grad():
        m(torch.randn(2, 8))
    assert kept_eager(m).run(m, bad) is None

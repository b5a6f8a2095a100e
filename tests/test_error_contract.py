"""The error contract of fuser's entry points (README, "Errors"): bad input raises TypeError or
ValueError naming the argument, never another exception type from torch, a producer or Python itself
(BufferError, a bare RuntimeError, AssertionError, KeyError, OverflowError, RecursionError...).
The random version of these checks is tests/test_fuzz.py."""
import numpy as np
import pytest
import torch

import fuser
from dlpack_producer import KDLCUDA, FakeExporter, Producer

K, N, L, M = 16, 48, 24, 5
CUDA_HOST = 3   # kDLCUDAHost: pinned host memory


def weights(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g).to(dtype) for s in ((M, K), (N, K), (L, N))]


@pytest.mark.parametrize("make, name", [
    (lambda x: x.to_sparse(), "x"),
    (lambda x: x.to_sparse_csr(), "x"),
    (lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "x"),
    (lambda x: x.to("meta"), "x"),
    (lambda x: torch.nested.nested_tensor([x[:2], x[2:]]), "x"),
    (lambda x: np.array([[object()] * K] * M), "x"),
])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tensors_no_producer_can_share_are_type_errors(make, name):
    x, w1, w2 = weights()
    with pytest.raises(TypeError, match=f"^{name}: cannot be taken through DLPack"):
        fuser.ffn(make(x), w1, w2)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_vmapped_call_is_a_type_error():
    _, w1, w2 = weights()
    with pytest.raises(TypeError, match="^x: cannot be taken through DLPack"):
        torch.func.vmap(lambda a: fuser.ffn(a, w1, w2))(torch.randn(3, M, K))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a torch build without CUDA")
@pytest.mark.parametrize("device", [(KDLCUDA, 0), (CUDA_HOST, 0)])
def test_foreign_tensors_this_torch_cannot_take_are_value_errors(device):
    p = Producer()
    t = [FakeExporter(p, device=device, shape=s) for s in ((M, K), (N, K), (L, N))]
    with pytest.raises(ValueError, match="^x: this torch cannot take the tensor in"):
        fuser.ffn(*t)


def test_out_that_requires_grad_is_a_value_error():
    x, w1, w2 = weights()
    out = torch.empty(M, L, requires_grad=True)
    with pytest.raises(ValueError, match="^out: it requires grad"):
        fuser.ffn(x, w1, w2, out=out)
    with torch.no_grad():
        fuser.ffn(x, w1, w2, out=out)      # allowed where autograd records nothing, as torch allows it
    torch.testing.assert_close(out.detach(), fuser.ffn_reference(x, w1, w2))


def test_activation_is_read_whole():
    x, w1, w2 = weights()
    for call in (lambda a: fuser.ffn(x, w1, w2, activation=a),
                 lambda a: torch.ops.fuser.ffn(x, w1, w2, None, None, None, None, a)):
        with pytest.raises(ValueError, match="^activation must not contain NUL characters"):
            call("relu\x00junk")
    with pytest.raises(ValueError, match="^activation is not valid Unicode text"):
        fuser.ffn(x, w1, w2, activation="relu\ud800")
    with pytest.raises(TypeError, match="^activation: expected a str .*got NoneType"):
        fuser.ffn(x, w1, w2, activation=None)


def test_the_operator_refuses_a_sparse_or_nested_x_by_name():
    """torch.ops.fuser.ffn checks x's layout before making it contiguous (which torch cannot do for a
    sparse tensor), and has a kernel for nested tensors that refuses them, so the contract's TypeError
    names x instead of torch's RuntimeError or NotImplementedError."""
    w_up, w_down = torch.randn(32, 8), torch.randn(8, 32)
    nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    for x in (torch.randn(4, 8).to_sparse(), torch.randn(4, 8).to_sparse_csr(), nested):
        with pytest.raises(TypeError, match="^x: expected a dense"):
            torch.ops.fuser.ffn(x, w_up, w_down, None, None, None, None, "relu")

"""On a Hopper GPU (marked gpu; skipped with the reason elsewhere): an optimized model on CUDA in
bfloat16 matches the unoptimized one, is captured and replayed in a CUDA graph, compiles (fullgraph,
Inductor, reduce-overhead, and the "fuser" backend), and trains with gradients matching eager.

Written against the GPU machine's stack (torch 2.11+cu130, transformers 5.17.0); run there by the
lead engineer: ``python -m pytest -q -m gpu``."""
import copy

import pytest
import torch

import fuser
import fuser.backend  # noqa: F401  (registers the backend where no entry point is installed)
from fuser import _C
from conftest import rel_error
from models import grads, hf, output

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]

BF16_BOUND = 2e-2   # relative error of bf16 logits against the bf16 unoptimized model


def cuda_model(name="llama", dtype=torch.bfloat16):
    model, inputs = hf(name)
    model = model.to("cuda", dtype)
    return model, {k: v.cuda() for k, v in inputs.items()}




@pytest.mark.parametrize("name", ["llama", "phi3", "gpt2", "bert", "gemma"])
def test_optimized_model_bf16_matches(name, op_calls):
    model, inputs = cuda_model(name)
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    assert fuser.report(model).fused and not fuser.report(model).skipped
    with torch.no_grad():
        err = rel_error(output(model, inputs), output(ref, inputs))
    assert op_calls and err < BF16_BOUND


class Residual(torch.nn.Module):
    def __init__(self, ffn, d):
        super().__init__()
        self.norm, self.ffn = torch.nn.LayerNorm(d), ffn

    def forward(self, x):
        return x + self.ffn(self.norm(x))


def ffn_stack(d=256):
    """Real HF LlamaMLP and GPT2MLP modules and a plain Sequential FFN, in residual blocks (no
    attention, so only fuser's own op decides whether capture works)."""
    import transformers as T
    torch.manual_seed(0)
    llama = T.LlamaConfig(hidden_size=d, intermediate_size=688, hidden_act="silu")
    gpt2 = T.GPT2Config(n_embd=d, activation_function="gelu_new")
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP
    ffns = [LlamaMLP(llama), GPT2MLP(4 * d, gpt2),
            torch.nn.Sequential(torch.nn.Linear(d, 512), torch.nn.GELU(), torch.nn.Linear(512, d))]
    return torch.nn.Sequential(*[Residual(f, d) for f in ffns]).eval().to("cuda", torch.bfloat16)


def test_cuda_graph_capture_and_replay(op_calls):
    model = ffn_stack()
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    assert len(fuser.report(model).fused) == 3
    static = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():   # warm up outside capture (no lazy work in it)
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(static)
    calls_at_capture = len(op_calls)
    for seed in (1, 2):
        new = torch.randn(static.shape, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16)
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            expected = ref(new)
        assert rel_error(static_out, expected) < BF16_BOUND
    assert len(op_calls) == calls_at_capture   # replay ran the captured kernels, no Python


def test_torch_compile_fullgraph_inductor(op_calls):
    model, inputs = cuda_model("llama")
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        err = rel_error(output(compiled, inputs), output(ref, inputs))
    assert err < BF16_BOUND and sum(torch._dynamo.utils.counters["graph_break"].values()) == 0


def test_torch_compile_reduce_overhead(op_calls):
    model, inputs = cuda_model("llama")
    ref = copy.deepcopy(model)
    fuser.optimize(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):   # warm-up, record, replay
            y = output(compiled, inputs).clone()
        err = rel_error(y, output(ref, inputs))
    assert err < BF16_BOUND


def test_fuser_backend_on_gpu(op_calls):
    model, inputs = cuda_model("llama")
    compiled = torch.compile(copy.deepcopy(model), backend="fuser")
    with torch.no_grad():
        err = rel_error(output(compiled, inputs), output(model, inputs))
    assert err < BF16_BOUND and op_calls
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_gradients_on_gpu_match(name, op_calls):
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model, inputs = cuda_model(name, torch.float32)
        ref = copy.deepcopy(model)
        fuser.optimize(model)
        output(model, inputs).square().mean().backward()
        output(ref, inputs).square().mean().backward()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert op_calls
    got, expected = grads(model), grads(ref)
    assert got.keys() == expected.keys()
    for k, g in expected.items():
        assert rel_error(got[k], g) < 1e-4, k


def record_launches(monkeypatch):
    """Record every launch of a prepared fused launch: "kept" (a FusedFFN's kept launch) or "route" (the
    general route's); the launches still run."""
    from fuser import module as module_py, route
    launches = []
    for mod, name in ((module_py, "kept"), (route, "route")):
        real = mod._ffn_run
        monkeypatch.setattr(mod, "_ffn_run", lambda *a, real=real, name=name: launches.append(name) or real(*a))
    return launches


def test_fused_module_launches_directly_on_later_calls_and_still_validates(monkeypatch, op_calls):
    """A FusedFFN whose route is a fused plan routes its first call (validation, then the route's launch),
    then launches the plan directly through its kept route: the kernel runs (results differ from eager's
    rounding, match float64), on the caller's stream, a misaligned input is copied, and a weight swapped
    for one of another shape raises the clear error instead of running."""
    from fuser import route, runtime
    from fuser.module import FusedFFN
    launches = record_launches(monkeypatch)
    torch.manual_seed(0)
    d, f = 256, 512
    mlp = torch.nn.Sequential(torch.nn.Linear(d, f), torch.nn.SiLU(), torch.nn.Linear(f, d)).cuda().bfloat16().eval()
    plan = fuser.plan(32, d, f, bias=True, activation="silu", dtype="bfloat16", fused=True)
    monkeypatch.setattr(runtime, "plan_for", lambda chain, device: plan)
    route.forget()
    routed = []
    real = route.FusedRoute.run
    monkeypatch.setattr(route.FusedRoute, "run", lambda *a, **k: routed.append(1) or real(*a, **k))
    module = FusedFFN.from_module(mlp)
    x = torch.randn(32, d, device="cuda", dtype=torch.bfloat16)
    w = module.weights()
    ref = fuser.ffn_reference(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="silu",
                              compute_dtype=torch.float64)
    eager = fuser.ffn_reference(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="silu")
    try:
        with torch.no_grad():
            ys = [module(x) for _ in range(3)]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                ys.append(module(x))
            torch.cuda.current_stream().wait_stream(s)
            buf = torch.empty(32 * d + 1, device="cuda", dtype=torch.bfloat16)
            xm = buf[1:].view(32, d)                          # 2-byte offset: not 16-byte aligned
            xm.copy_(x)
            ys.append(module(xm))
        # every call launched; the first was routed (the route prepares its launch, the module its kept
        # one), the next two took the kept launch, the new stream and the misaligned input (copied) were
        # routed again (the new stream prepared once more)
        assert op_calls == ["silu"] * 3 and len(routed) == 3
        assert launches == ["route", "kept", "kept", "route", "route"]
        for y in ys:
            assert rel_error(y, ref) <= 2 * rel_error(eager, ref) + 1e-3
            assert not torch.equal(y, eager)
        kept = module.__dict__["_kept"]
        assert kept.fast is not None              # its checks and launch run in one C call (_C.kept_launch)
        with torch.no_grad():
            assert torch.equal(_C.kept_launch(module.__dict__, x, kept.fast), kept.run(module, x))
            assert _C.kept_launch(module.__dict__, x[:16], kept.fast) is None      # another shape: declined
            # fuser.ffn on the same kept route: its prepared launch run by _C.ffn_kept, as route.run runs it
            args = (x, w["up"], w["down"], None, w["b_up"], None, w["b_down"], "silu")
            r = fuser.ops.route(*args)
            assert r.fused and r.fast is not None
            assert torch.equal(fuser.ffn(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="silu"),
                               r.run(*args))
        with torch.no_grad():
            mlp[2].weight = torch.nn.Parameter(torch.randn(d, 2 * f, device="cuda", dtype=torch.bfloat16))
            with pytest.raises(ValueError, match="w_down"):
                module(x)
    finally:
        route.forget()


def test_fast_launch_sees_weight_updates_and_bails_out_when_anything_changes(monkeypatch):
    """The kept launch borrows weight capsules exported once: in-place updates are seen (same memory),
    `.data = ...` and a new Parameter are exported again, and FUSER_DISABLE (no launch at all), autocast,
    grad mode and a new shape all go the general way; every output matches the float64 reference of the
    weights of the moment."""
    from fuser import route, runtime
    from fuser.module import FusedFFN
    torch.manual_seed(0)
    d, f = 256, 512
    mlp = torch.nn.Sequential(torch.nn.Linear(d, f), torch.nn.SiLU(), torch.nn.Linear(f, d)).cuda().bfloat16().eval()
    monkeypatch.setattr(runtime, "plan_for", lambda chain, device: fuser.plan(
        chain["m"], d, f, bias=True, activation="silu", dtype="bfloat16", fused=True))
    route.forget()
    launches = record_launches(monkeypatch)
    module = FusedFFN.from_module(mlp)
    x = torch.randn(32, d, device="cuda", dtype=torch.bfloat16)

    def check(y, xin=x):
        w = module.weights()
        ref = fuser.ffn_reference(xin, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="silu",
                                  compute_dtype=torch.float64)
        eager = fuser.ffn_reference(xin, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="silu")
        assert rel_error(y, ref) <= 2 * rel_error(eager, ref) + 1e-3

    def calls(n=1):
        """Run n calls; how many launched through the general route (not the kept launch)."""
        before = len(launches)
        with torch.no_grad():
            for _ in range(n):
                y = module(x)
                check(y)
        return sum(1 for path in launches[before:] if path == "route")

    try:
        calls(2)
        assert "_kept" in module.__dict__ and calls(3) == 0           # kept: no general route
        with torch.no_grad():
            mlp[0].weight.mul_(-1.5)                                   # in place: same memory, seen
        assert calls() == 0
        with torch.no_grad():
            mlp[2].weight.data = torch.randn(d, f, device="cuda", dtype=torch.bfloat16) * f ** -0.5
        assert calls() == 1 and calls() == 0                           # .data: prepared again once
        mlp[2].bias = torch.nn.Parameter(torch.randn(d, device="cuda", dtype=torch.bfloat16))
        assert calls() == 1 and calls() == 0                           # a new Parameter: the same
        monkeypatch.setenv("FUSER_DISABLE", "1")
        before = len(launches)
        assert calls() == 0 and len(launches) == before                # the PyTorch ops ran, no launch at all
        monkeypatch.delenv("FUSER_DISABLE")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            before = len(launches)
            assert calls() == 0 and len(launches) == before            # eager under autocast
        x2 = torch.randn(48, d, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y2 = module(x2)                                            # a new shape: routed
        check(y2, x2)
        y = module(x)                                                  # grad mode, weights need grad: eager
        assert y.requires_grad
        check(y.detach())
        copy.deepcopy(module)                                          # run-time state is not copied
    finally:
        route.forget()


def test_host_bound_route_launches_outside_graphs_and_captures_the_eager_ops(monkeypatch):
    """GPT-2's FFN at 128 tokens, which the planner runs eager in a CUDA graph, on a host whose PyTorch ops
    cost 30 us each: FusedFFN and fuser.ffn launch its best fused plan outside graphs (within the kernel's
    rounding of float64), and a CUDA graph captured from the same module holds the eager ops (nothing fused
    is launched while capturing), which replay to the original module's results."""
    from fuser import route, runtime
    from fuser.module import FusedFFN
    monkeypatch.setattr(runtime, "host_op_us", lambda device: 30.0)
    launches = record_launches(monkeypatch)
    route.forget()
    try:
        torch.manual_seed(0)
        m, d, f = 128, 768, 3072
        mlp = torch.nn.Sequential(torch.nn.Linear(d, f), torch.nn.GELU(), torch.nn.Linear(f, d)).cuda().bfloat16().eval()
        assert not fuser.plan(m, d, f, bias=True, dtype="bfloat16").fused
        module = FusedFFN.from_module(copy.deepcopy(mlp))
        w = module.weights()
        x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
        ref = fuser.ffn_reference(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="gelu",
                                  compute_dtype=torch.float64)
        with torch.no_grad():
            eager = mlp(x)
            ys = [module(x) for _ in range(3)]
            ys.append(fuser.ffn(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"], activation="gelu"))
        assert isinstance(module.__dict__["_kept"].route, route.HostBoundRoute)
        assert launches == ["route", "kept", "kept", "route"]
        for y in ys:
            assert rel_error(y, ref) <= 2 * rel_error(eager, ref) + 1e-3 and not torch.equal(y, eager)
        static = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():   # warm up outside capture: fused launches
            for _ in range(2):
                module(static)
        torch.cuda.current_stream().wait_stream(side)
        warm = len(launches)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            out = module(static)
        assert warm == 6 and len(launches) == warm       # the capture launched nothing fused
        for seed in (1, 2):
            static.copy_(torch.randn(m, d, generator=torch.Generator().manual_seed(seed)).cuda().bfloat16())
            graph.replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                assert rel_error(out, mlp(static)) < 2e-3
    finally:
        route.forget()

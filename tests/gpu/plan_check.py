"""One correctness check of a fused plan on the GPU, shared by the correctness matrices
(tests/gpu/matrix.py, tests/gpu/stream_matrix.py), the GPU tests and benchmarks/kernel_check.py: fresh
random FFN tensors at unit output scale, a float64 reference, PyTorch eager's own error beside it, and
three launches into NaN-poisoned outputs that must all be written and bitwise identical; and the CUDA
graph of a list of calls they time and replay."""
import torch

import fuser


def rel(y, ref):
    """Relative Frobenius error of y against ref, in float64."""
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def ffn_tensors(gen, m, d, f, l, *, gated, bias, dtype, bias_scale=0.3):
    """x [m, d], w_up/w_gate [f, d], w_down [l, f] (and biases) drawn from gen on its device in float32,
    weights scaled by 1/sqrt(fan-in) so every stage stays near unit scale, then cast to dtype."""
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=gen.device, dtype=torch.float32) * scale).to(dt)
    t = dict(x=r(m, d), w_up=r(f, d, scale=d ** -0.5), w_down=r(l, f, scale=f ** -0.5))
    if gated:
        t["w_gate"] = r(f, d, scale=d ** -0.5)
    if bias:
        t["b_up"], t["b_down"] = r(f, scale=bias_scale), r(l, scale=bias_scale)
        if gated:
            t["b_gate"] = r(f, scale=bias_scale)
    return t


def check_plan(plan, activation, t, runs=3, slack=0.0):
    """Runs plan on tensors t `runs` times into NaN-poisoned outputs. ok when the error against float64 is
    at most twice eager's (plus slack), no NaN is left and every run is bitwise identical to the first."""
    x = t["x"]
    ref = fuser.ffn_reference(activation=activation, compute_dtype=torch.float64, **t)
    eager = fuser.ffn_reference(activation=activation, **t)
    outs = []
    for _ in range(runs):
        out = torch.full((x.shape[0], t["w_down"].shape[0]), float("nan"), device=x.device, dtype=x.dtype)
        fuser.ffn(activation=activation, out=out, plan=plan, **t)
        outs.append(out)
    if x.is_cuda:
        torch.cuda.synchronize()
    err, err_eager = rel(outs[0], ref), rel(eager, ref)
    nan = bool(torch.isnan(outs[0]).any())
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    return dict(err=err, eager_err=err_eager, nan=nan, identical=same,
                ok=bool(err <= 2 * err_eager + slack and not nan and same))


def graph_of(calls):
    """A CUDA graph of the calls (each a no-argument function) in order, warmed up on a side stream first."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g

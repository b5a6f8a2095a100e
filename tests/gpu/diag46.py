import sys, torch, fuser
m, dtype, bias = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
p = fuser.plan(m, 256, 14336, gated=True, activation="silu", bias=bias, dtype=dtype, target="h200", fused=True,
               cluster=(1, 4, 2, 2), bm=64, bn=128, n_iters=4, bl=128, stages=3, order="n_outer", gate_mode="sequential")
dt = getattr(torch, dtype); d, f = 256, 14336
g = torch.Generator(device="cuda").manual_seed(0)
t = dict(x=torch.randn(m, d, device="cuda", generator=g).to(dt), w_up=(torch.randn(f, d, device="cuda", generator=g) / 16).to(dt),
         w_gate=(torch.randn(f, d, device="cuda", generator=g) / 16).to(dt), w_down=(torch.randn(d, f, device="cuda", generator=g) / 120).to(dt))
if bias:
    t.update(b_up=torch.randn(f, device="cuda").to(dt), b_gate=torch.randn(f, device="cuda").to(dt), b_down=torch.randn(d, device="cuda").to(dt))
try:
    y = fuser.ffn(activation="silu", plan=p, **t); torch.cuda.synchronize()
    ref = fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **t)
    print(f"M={m} {dtype} bias={bias}: ok err {float((y.double()-ref).norm()/ref.norm()):.2e}")
except Exception as e:
    print(f"M={m} {dtype} bias={bias}: FAIL {type(e).__name__} {str(e)[:80]}")

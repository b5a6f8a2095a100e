"""The fuzzer's quantized (FP8) calls of ``fuser.ffn(..., scales=)`` (tests/test_fuzz.py): e4m3 weights and
their scales from ``fuser.fp8.quantize_ffn`` over random shapes, plain and gated, with and without biases,
valid (whose result must be ``fuser.fp8.reference``'s bits, as the CPU route runs it) and with one defect
each (a scale missing, misshaped, of another dtype or not a tensor; scales given to a 16-bit FFN; x, a
weight, a bias or out in a dtype a quantized FFN does not take), each a contract error naming what is
wrong."""
from __future__ import annotations

from fuzz_tensors import INVALID, VALID, Case


class QuantizedCalls:
    """Calls with e4m3 weights and scales. A subclass (test_fuzz.Fuzzer) sets rng, gen, torch, fuser and
    acts, and has TensorCalls' helpers (pick, randn, close)."""

    def quantized(self, gated=None, bias=None, lead=None):
        """Valid quantized fuser.ffn arguments (x bfloat16, weights e4m3, scales, biases bfloat16) and the
        float weights they were quantized from."""
        from fuser import fp8
        k, n, l = self.pick(1, 2, 8, 16, 48, 64), self.pick(1, 4, 16, 40, 96), self.pick(1, 8, 24, 64)
        lead = self.pick((), (0,), (1,), (3,), (7,), (2, 3)) if lead is None else lead
        gated = self.rng.random() < 0.5 if gated is None else gated
        bias = self.pick(set(), {"up"}, {"down"}, {"up", "gate", "down"}) if bias is None else bias
        f32 = self.torch.float32
        w_up, w_down = self.randn(n, k, dtype=f32, scale=k ** -0.5), self.randn(l, n, dtype=f32, scale=n ** -0.5)
        w_gate = self.randn(n, k, dtype=f32, scale=k ** -0.5) if gated else None
        act = self.pick(*self.acts)
        q = fp8.quantize_ffn(w_up, w_down, w_gate=w_gate, x_samples=self.randn(4, k, dtype=f32), activation=act)
        a = dict(x=self.randn(*lead, k, dtype=self.torch.bfloat16), w_up=q.w_up, w_down=q.w_down,
                 scales=q.scales, activation=act)
        if gated:
            a["w_gate"] = q.w_gate
        for name, size in (("up", n), ("gate", n), ("down", l)):
            if name in bias and (gated or name != "gate"):
                a["b_" + name] = self.randn(size, dtype=self.torch.bfloat16, scale=0.1)
        return a

    def fp8_case(self, label, expect, a):
        from fuser import fp8
        torch, fuser = self.torch, self.fuser

        def call():
            return fuser.ffn(**a)

        def check(y):
            t = {k: v for k, v in a.items() if k not in ("out", "scales", "x", "w_up", "w_down")}
            ref = fp8.reference(a["x"], a["w_up"], a["w_down"], a["scales"], **t)
            problem = self.close(y, ref.double(), torch.bfloat16, a.get("out"))
            if problem is None and not torch.equal(y.detach(), ref):
                return "not the bits of fuser.fp8.reference (the CPU route runs it)"
            return problem
        return Case("ffn_fp8", label, expect, call, check)

    # ---- generators ----
    def fp8_valid(self):
        torch = self.torch
        a = self.quantized()
        variant = self.pick("plain", "out", "scalar_scales", "scales_grad", "x_grad", "inference")
        x = a["x"]
        if variant == "out":
            a["out"] = torch.empty(*x.shape[:-1], a["w_down"].shape[0], dtype=torch.bfloat16)
        elif variant == "scalar_scales":   # x's and h's scale as 0-dim tensors
            a["scales"] = a["scales"]._replace(x=a["scales"].x.reshape(()), h=a["scales"].h.reshape(()))
        elif variant == "scales_grad":     # scales a caller made require grad: constants to the FFN
            a["scales"] = type(a["scales"])(*(None if s is None else s.clone().requires_grad_()
                                              for s in a["scales"]))
        elif variant == "x_grad":
            a["x"] = x.clone().requires_grad_()
        if variant == "inference":
            with torch.inference_mode():
                a["x"] = x.clone()
        return self.fp8_case(f"valid {variant}", VALID, a)

    def fp8_invalid(self):
        torch = self.torch
        a = self.quantized(lead=self.pick((5,), (2, 3), (1,)))
        s = a["scales"]
        n, l = a["w_up"].shape[0], a["w_down"].shape[0]
        defect = self.pick("no_scales", "scales_type", "scale_shape", "scale_dtype", "scale_not_tensor",
                           "x_scale_two", "gate_scale_extra", "gate_scale_missing", "sixteen_bit_weights",
                           "x_dtype", "weight_dtype", "bias_dtype", "out_dtype", "out_shape")
        if defect == "no_scales":
            a.pop("scales")
        elif defect == "scales_type":
            a["scales"] = self.pick(tuple(s), dict(s._asdict()), s.x, 1.0)
        elif defect == "scale_shape":
            role, size = self.pick(("up", n), ("down", l), *((("gate", n),) if "w_gate" in a else ()))
            a["scales"] = s._replace(**{role: torch.ones(size + self.pick(1, 3))})
        elif defect == "scale_dtype":
            role = self.pick("x", "up", "down", "h")
            a["scales"] = s._replace(**{role: getattr(s, role).to(self.pick(torch.bfloat16, torch.float64))})
        elif defect == "scale_not_tensor":
            a["scales"] = s._replace(**{self.pick("up", "down"): self.pick(1.0, [1.0] * n, "1")})
        elif defect == "x_scale_two":
            a["scales"] = s._replace(**{self.pick("x", "h"): torch.ones(2)})
        elif defect == "gate_scale_extra":
            a.pop("w_gate", None), a.pop("b_gate", None)
            a["scales"] = s._replace(gate=torch.ones(n))
        elif defect == "gate_scale_missing":
            if "w_gate" not in a:
                a["w_gate"] = a["w_up"]
            a["scales"] = s._replace(gate=None)
        elif defect == "sixteen_bit_weights":   # scales beside a bfloat16 FFN
            for w in ("w_up", "w_down", "w_gate"):
                if w in a:
                    a[w] = a[w].to(torch.bfloat16)
        elif defect == "x_dtype":
            a["x"] = a["x"].to(self.pick(torch.float32, torch.float16))
        elif defect == "weight_dtype":
            w = self.pick(*[w for w in ("w_up", "w_down", "w_gate") if w in a])
            a[w] = a[w].to(self.pick(torch.bfloat16, torch.float32))
        elif defect == "bias_dtype":
            b = self.pick("b_up", "b_down")
            a[b] = self.randn(n if b == "b_up" else l, dtype=self.pick(torch.float32, torch.float16))
        elif defect == "out_dtype":
            a["out"] = torch.empty(*a["x"].shape[:-1], l, dtype=self.pick(torch.float32, torch.float16))
        elif defect == "out_shape":
            a["out"] = torch.empty(*a["x"].shape[:-1], l + 1, dtype=torch.bfloat16)
        return self.fp8_case(defect, INVALID, a)

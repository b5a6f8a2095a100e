"""The fuzzer's calls of the tools (tests/test_fuzz.py): ``fuser.optimize`` and ``fuser.report`` on
random small models, ``fuser.quantize`` on random small bfloat16 ones, and the command line in process
with good and bad values."""
from __future__ import annotations

import contextlib
import copy
import io

from fuzz_tensors import INVALID, VALID, Case, Traceback


#: How far a quantized model of two FFNs may be from its bfloat16 model (relative Frobenius error), calibrated
#: on samples holding its input: measured up to ~0.2 on these small random models (median 0.05; e4m3's 3
#: mantissa bits over 16-64 features); a misapplied scale moves it by ~1 or more.
QUANTIZED_ERROR = 0.5


def gated_ffn(nn, k, n, bias, act):
    """A gated FFN module as models write one: down(act(gate(x)) * up(x)), k -> n -> k."""
    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = nn.Linear(k, n, bias=bias), nn.Linear(k, n, bias=bias)
            self.down, self.act = nn.Linear(n, k, bias=bias), act

        def forward(self, x):
            return self.down(self.act(self.gate(x)) * self.up(x))
    return Gated()


class ModelCalls:
    """Calls of optimize and the command line; mixed into test_fuzz.Fuzzer."""

    # ---- optimize on random small models ----
    def optimize(self):
        torch, nn, fuser = self.torch, self.torch.nn, self.fuser
        k, n = self.pick(8, 16, 32), self.pick(16, 48, 64)
        act = self.pick(nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.Mish(), nn.Tanh())
        dtype = self.pick(torch.float32, torch.float32, torch.bfloat16, torch.float64)
        shape = self.pick("sequential", "gated", "dropout", "norm_between", "nested", "root_ffn", "hooks",
                          "quantized")
        bias = self.rng.random() < 0.5

        def Gated():
            return gated_ffn(nn, k, n, bias, act)
        mlp = {"sequential": lambda: nn.Sequential(nn.Linear(k, n, bias=bias), act, nn.Linear(n, k, bias=bias)),
               "gated": Gated,
               "dropout": lambda: nn.Sequential(nn.Linear(k, n), act, nn.Dropout(0.1), nn.Linear(n, k)),
               "norm_between": lambda: nn.Sequential(nn.Linear(k, n), nn.LayerNorm(n), act, nn.Linear(n, k)),
               "nested": lambda: nn.Sequential(nn.LayerNorm(k), nn.Sequential(nn.Linear(k, n), act, nn.Linear(n, k))),
               "root_ffn": Gated, "hooks": Gated,
               "quantized": lambda: nn.Sequential(nn.Linear(k, n), nn.ReLU(), nn.Linear(n, k))}[shape]()
        if shape == "quantized":
            dtype = torch.float32
        model = mlp.to(dtype).eval()
        if shape == "hooks":   # a hook that changes the output must keep working after optimize
            target = self.pick(model, model.up, model.down)
            if self.rng.random() < 0.5:
                target.register_forward_hook(lambda mod, args, out: out * 2 + 1)
            else:
                target.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,))
        elif shape == "quantized":
            model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        x = self.randn(self.pick(1, 3), self.pick(1, 5), k, dtype=dtype)
        with torch.no_grad():
            ref = copy.deepcopy(model)(x).double()

        def call():
            out = fuser.optimize(model)
            str(fuser.report(out))
            with torch.no_grad():
                return out(x)

        def check(y):
            if dtype == torch.float64:
                return None if (y - ref).abs().max().item() <= 1e-9 * max(1.0, ref.abs().max().item()) else "differs"
            return self.close(y, ref, dtype)
        return Case("optimize", f"{shape}/{type(act).__name__}/{str(dtype)[6:]}", VALID, call, check)

    # ---- quantize on random small bfloat16 models ----
    def quantize(self):
        """fuser.quantize(model, samples): every FFN the forward reaches runs FP8; a model of one FFN gives
        the bits of fp8.reference on weights quantize_ffn quantized and calibrated on the same samples (the
        CPU route runs it), a model of two an output near the bfloat16 model's (QUANTIZED_ERROR); and
        dequantize gives the optimized bfloat16 model's bits back."""
        torch, nn, fuser = self.torch, self.torch.nn, self.fuser
        k, n = self.pick(16, 32, 64), self.pick(16, 48, 64)
        act = self.pick(nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU())
        shape = self.pick("sequential", "gated", "nested", "two")
        bias = self.rng.random() < 0.5

        def Gated():
            return gated_ffn(nn, k, n, bias, act)

        def plain():
            return nn.Sequential(nn.Linear(k, n, bias=bias), act, nn.Linear(n, k, bias=bias))
        model = {"sequential": plain, "gated": Gated,
                 "nested": lambda: nn.Sequential(nn.LayerNorm(k), plain()),
                 "two": lambda: nn.Sequential(plain(), nn.LayerNorm(k), Gated())}[shape]().bfloat16().eval()
        x = self.randn(self.pick(1, 3), self.pick(1, 5), k, dtype=torch.bfloat16)
        # calibrated on samples that hold x's rows (static scales clip what their samples did not reach)
        samples = torch.cat([x.reshape(-1, k), self.randn(self.pick(0, 8, 32), k, dtype=torch.bfloat16)])

        def definition():
            """The FP8 FFN's output by its definition, for a model of one FFN (None for two)."""
            from fuser import fp8
            if shape == "two":
                return None
            ln, ffn = (model[0], model[1]) if shape == "nested" else (None, model)
            inp, smp = (ln(x), ln(samples)) if ln is not None else (x, samples)
            up, down, gate = (ffn.up, ffn.down, ffn.gate) if shape == "gated" else (ffn[0], ffn[2], None)
            name = {"ReLU": "relu", "SiLU": "silu"}.get(type(act).__name__) or (
                "gelu_tanh" if act.approximate == "tanh" else "gelu")
            b_up, b_gate = up.bias, None if gate is None else gate.bias
            q = fp8.quantize_ffn(up.weight, down.weight, w_gate=None if gate is None else gate.weight, b_up=b_up,
                                 b_gate=b_gate, x_samples=smp, activation=name)
            return fp8.reference(inp, q.w_up, q.w_down, q.scales, w_gate=q.w_gate, b_up=b_up, b_gate=b_gate,
                                 b_down=down.bias, activation=name)

        def call():
            with torch.no_grad():
                want = definition()
                y16 = fuser.optimize(copy.deepcopy(model))(x)
                q = fuser.quantize(model, samples)
                y8 = q(x)
                ffns = [m for m in q.modules() if isinstance(m, fuser.FusedFFN)]
                running = [m.running().split(":")[0] for m in ffns]
                for m in ffns:
                    m.dequantize()
                return y16, y8, q(x), running, want

        def check(res):
            y16, y8, back, running, want = res
            if not running or any(not r.startswith("FP8") for r in running):
                return f"FFNs running: {running}"
            if not torch.equal(back, y16):
                return "dequantize did not give the bfloat16 model's bits back"
            if y8.dtype != torch.bfloat16 or not bool(torch.isfinite(y8).all()):
                return f"FP8 output {y8.dtype}, finite: {bool(torch.isfinite(y8).all())}"
            if want is not None and not torch.equal(y8, want):
                return "not the bits of fuser.fp8.reference on quantize_ffn's weights and scales"
            err = ((y8.double() - y16.double()).norm() / y16.double().norm().clamp_min(1e-6)).item()
            return None if want is not None or err <= QUANTIZED_ERROR else f"FP8 output {err:.3f} from the bfloat16 model's"
        return Case("quantize", f"{shape}/{type(act).__name__}/bias={bias}", VALID, call, check)

    # ---- the command line, in process ----
    def cli(self):
        from fuser.tools import cli
        good = self.rng.random() < 0.3
        if good:
            argv = ["plan", "--tokens", self.pick("1", "16", "128"), "--d-model", self.pick("64", "768"),
                    "--d-ff", self.pick("128", "3072"), "--target", self.pick("h200", "h100")]
            argv += self.pick([], ["--gated", "--activation", "silu"], ["--top", "3"], ["--json"], ["--fused", "no"])
        else:
            argv = self.pick(
                ["plan", "--tokens", self.pick("0", "-1", "abc", "1.5", str(2 ** 63)), "--d-model", "64", "--d-ff", "128"],
                ["plan", "--tokens", "16", "--d-model", self.pick("0", "-64", str(2 ** 40)), "--d-ff", "128"],
                ["plan", "--tokens", "16", "--d-model", "64", "--d-ff", "128", "--dataflow", "bogus"],
                ["plan", "--tokens", "16", "--d-model", "64", "--d-ff", "128", "--target", self.pick("a100", "")],
                ["plan", "--tokens", "16", "--d-model", "64", "--d-ff", "128", "--top", self.pick("0", "-3", "65")],
                ["warmup", "--tokens", self.pick("0", "-1", "a", "1,,2", "")],
                ["explain", "--tokens", self.pick("0", "-5", "x")],
                ["env", "--device", "abc"],
                ["bogus-command"], [])
        err = io.StringIO()

        def call():
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    code = cli.main(argv)
            except SystemExit as e:
                code = e.code
            except Exception as e:  # noqa: BLE001 (python -m fuser would print a traceback)
                raise Traceback(f"{type(e).__name__}: {e}") from None
            if code not in (0, 2, None):
                raise ValueError(f"exit status {code}")  # counted as an answer, checked below
            if code == 2:
                if "Traceback" in err.getvalue() or not err.getvalue().strip():
                    raise RuntimeError(f"exit 2 without a usage message: {err.getvalue()[-300:]!r}")
                raise ValueError("usage error")          # the CLI's contract: exit status 2 and a message
            return code or 0

        label = ("good " if good else "bad ") + " ".join(map(repr, argv))
        return Case("cli", label, VALID if good else INVALID, call, lambda code: None)

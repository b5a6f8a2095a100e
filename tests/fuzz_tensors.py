"""The fuzzer's calls of ``fuser.ffn`` and the operator ``torch.ops.fuser.ffn`` (tests/test_fuzz.py):
random tensors valid and invalid (dtypes, shapes from 0 to 2**40 as metadata, strides, storage offsets,
alignment, ``out`` aliasing an input, foreign DLPack producers), each with what the error contract
expects of it, and the helpers the other call families share."""
from __future__ import annotations

import math

VALID, INVALID, EITHER = "valid", "invalid", "either"


class Traceback(Exception):
    """What the command line let escape: ``python -m fuser`` would print a traceback."""


class Case:
    """One call: its entry point, a label saying what was fuzzed, what the contract expects, the call,
    and for a result a check returning None or what is wrong with it."""

    __slots__ = ("entry", "label", "expect", "call", "check")

    def __init__(self, entry, label, expect, call, check=None):
        self.entry, self.label, self.expect, self.call, self.check = entry, label, expect, call, check


class TensorCalls:
    """Calls with tensors. A subclass (test_fuzz.Fuzzer) sets rng, gen, np, torch, fuser, dl (the
    tests' DLPack producer module), producer, dtypes, tol, acts and base_plans."""

    # ---- helpers ----
    def pick(self, *xs):
        return self.rng.choice(xs)

    def randn(self, *shape, dtype, scale=1.0):
        t = self.torch.randn(*shape, generator=self.gen, dtype=self.torch.float64) * scale
        return t.to(dtype)

    def tensors(self, dtype, gated=None, bias=None, lead=None, dims=None):
        """Valid fuser.ffn arguments: dict of tensors plus the activation."""
        k, n, l = dims or (self.pick(1, 2, 3, 8, 16, 24, 48, 64), self.pick(1, 4, 16, 40, 96, 128),
                           self.pick(1, 8, 24, 64))
        lead = self.pick((), (0,), (1,), (3,), (7,), (2, 3), (3, 0, 2), (2 ** 40, 0)) if lead is None else lead
        gated = self.rng.random() < 0.4 if gated is None else gated
        bias = self.pick(set(), {"up"}, {"down"}, {"up", "gate", "down"}) if bias is None else bias
        a = dict(x=self.randn(*lead, k, dtype=dtype), w_up=self.randn(n, k, dtype=dtype, scale=k ** -0.5),
                 w_down=self.randn(l, n, dtype=dtype, scale=n ** -0.5))
        if gated:
            a["w_gate"] = self.randn(n, k, dtype=dtype, scale=k ** -0.5)
        for name, size in (("up", n), ("gate", n), ("down", l)):
            if name in bias and (gated or name != "gate"):
                a["b_" + name] = self.randn(size, dtype=dtype, scale=0.1)
        a["activation"] = self.pick(*self.acts)
        return a

    def reference(self, a):
        torch = self.torch
        t = {k: (v if v is None or isinstance(v, str) else torch.as_tensor(v) if not isinstance(v, torch.Tensor)
                 else v.detach()) for k, v in a.items() if k not in ("out", "plan")}
        x, w1, w2 = t.pop("x"), t.pop("w_up"), t.pop("w_down")
        return self.fuser.ffn_reference(x, w1, w2, compute_dtype=torch.float64, **t)

    def close(self, y, ref, dtype, out=None):
        torch = self.torch
        if not isinstance(y, torch.Tensor):
            return f"returned {type(y).__name__}"
        if out is not None and y is not out and y.data_ptr() != (
                out.data_ptr() if isinstance(out, torch.Tensor) else out.ctypes.data):
            return "out= given but another tensor returned"
        if tuple(y.shape) != tuple(ref.shape) or y.dtype != dtype:
            return f"got {tuple(y.shape)} {y.dtype}, expected {tuple(ref.shape)} {dtype}"
        if ref.numel() == 0:
            return None
        err = (y.detach().double() - ref).abs().max().item()
        # inputs are N(0, 1) and weights scaled by fan-in, so outputs and their rounding errors are O(1)
        # even where a result is small (a cancellation): tolerances are relative to at least 1
        scale = max(ref.abs().max().item(), 1.0)
        if not err <= self.tol[dtype] * scale:
            return f"max error {err:.3g} at scale {scale:.3g} ({dtype})"
        return None

    def ffn_case(self, entry, label, expect, a, dtype=None):
        fuser = self.fuser
        dtype = dtype or a["x"].dtype

        def call():
            return fuser.ffn(**a)

        def check(y):
            return self.close(y, self.reference(a), dtype, a.get("out"))
        return Case(entry, label, expect, call, check)

    # ---- fuser.ffn with torch tensors ----
    def ffn_valid(self):
        torch = self.torch
        dtype = self.pick(*self.dtypes)
        a = self.tensors(dtype)
        variant = self.pick("plain", "out", "requires_grad", "aliased_inputs", "offset", "unit_strides", "numpy",
                            "plan", "inference")
        x = a["x"]
        if variant == "out":
            a["out"] = torch.empty(*x.shape[:-1], a["w_down"].shape[0], dtype=dtype)
        elif variant == "requires_grad":
            a["w_up"].requires_grad_(True)
        elif variant == "aliased_inputs" and "w_gate" in a:
            a["w_gate"] = a["w_up"]                          # read-only aliasing is fine
        elif variant == "offset":                            # a view 16 bytes into a larger buffer
            per16 = 16 // x.element_size()
            buf = torch.empty(x.numel() + per16 * self.pick(1, 2, 5), dtype=dtype)
            v = buf[buf.numel() - x.numel():].view(x.shape)
            v.copy_(x)
            a["x"] = v
        elif variant == "unit_strides" and x.dim() >= 2 and x.shape[0] == 1:
            a["x"] = x.as_strided(x.shape, (12345,) + x.stride()[1:])  # an extent-1 dimension's stride is free
        elif variant == "numpy" and dtype != torch.bfloat16:
            for k in ("x", "w_up", "w_down"):
                a[k] = a[k].numpy()
        elif variant == "plan":
            m = max(1, math.prod(x.shape[:-1]))
            bias = tuple(n for n in ("up", "gate", "down") if f"b_{n}" in a)
            try:
                a["plan"] = self.fuser.plan(m, x.shape[-1], a["w_up"].shape[0], d_out=a["w_down"].shape[0],
                                            gated="w_gate" in a, activation=a["activation"], bias=bias,
                                            dtype=str(dtype).replace("torch.", ""), target="h200")
            except ValueError:
                pass
        elif variant == "inference":
            with torch.inference_mode():
                a = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
        return self.ffn_case("ffn", f"valid/{variant}", VALID, a, dtype)

    def ffn_invalid(self):
        torch = self.torch
        dtype = self.pick(*self.dtypes)
        a = self.tensors(dtype, lead=self.pick((5,), (2, 3), (1,)))
        x, k, n, l = a["x"], a["x"].shape[-1], a["w_up"].shape[0], a["w_down"].shape[0]
        other = self.pick(*[d for d in self.dtypes if d != dtype])
        name = self.pick(*[t for t in ("x", "w_up", "w_down", "w_gate", "b_up", "b_down") if t in a])
        defect = self.pick("dtype", "mixed_dtype", "shape", "gate_shape", "bias_shape", "b_gate_alone", "zero_dim",
                           "d_model_0", "d_ff_0", "out_shape", "out_dtype", "out_alias", "out_partial_alias",
                           "out_strided", "out_grad", "strided", "misaligned", "activation", "not_tensor",
                           "raw_capsule", "layout", "plan_junk", "plan_other_chain", "grad_out")
        if defect == "dtype":
            a[name] = a[name].to(self.pick(torch.float64, torch.int32, torch.bool, torch.complex64, torch.uint8,
                                           torch.int64))
        elif defect == "mixed_dtype":
            a[name] = a[name].to(other)
        elif defect == "shape":
            a[name] = self.randn(*[s + self.pick(1, 2, 7) for s in a[name].shape], dtype=dtype)
        elif defect == "gate_shape":
            a["w_gate"] = self.randn(n + 1, k, dtype=dtype)
        elif defect == "bias_shape":
            b, size = self.pick(("b_up", n), ("b_down", l))
            a[b] = self.randn(self.pick(size + 1, 0), dtype=dtype)
        elif defect == "b_gate_alone":
            a.pop("w_gate", None)
            a["b_gate"] = self.randn(n, dtype=dtype)
        elif defect == "zero_dim":
            a["x"] = self.randn(dtype=dtype)
        elif defect == "d_model_0":
            a.update(x=torch.empty(3, 0, dtype=dtype), w_up=torch.empty(n, 0, dtype=dtype))
            a.pop("w_gate", None), a.pop("b_gate", None)
        elif defect == "d_ff_0":
            a.update(w_up=torch.empty(0, k, dtype=dtype), w_down=torch.empty(l, 0, dtype=dtype))
            for t in ("w_gate", "b_up", "b_gate"):
                a.pop(t, None)
        elif defect == "out_shape":
            a["out"] = torch.empty(*x.shape[:-1], l + 1, dtype=dtype)
        elif defect == "out_dtype":
            a["out"] = torch.empty(*x.shape[:-1], l, dtype=other)
        elif defect == "out_alias":
            a["w_down"] = self.randn(k, n, dtype=dtype)
            a.pop("b_down", None)
            a["out"] = a["x"]                                 # d_out == d_model: out is x itself
        elif defect == "out_partial_alias":
            buf = torch.empty(x.numel() + 64 * l, dtype=dtype)
            a["x"] = buf[:x.numel()].view(x.shape)
            a["x"].copy_(x)
            start = (x.numel() // 2) // 8 * 8
            a["out"] = buf[start:start + math.prod(x.shape[:-1]) * l].view(*x.shape[:-1], l)
        elif defect == "out_strided":
            a["out"] = torch.empty(*x.shape[:-1], 2 * l, dtype=dtype)[..., ::2]
            if a["out"].is_contiguous():                      # one row of one column: strides do not matter
                return self.ffn_invalid()
        elif defect == "out_grad":
            a["out"] = torch.empty(*x.shape[:-1], l, dtype=dtype, requires_grad=True)
        elif defect == "grad_out":
            a["x"].requires_grad_(True)
            a["out"] = torch.empty(*x.shape[:-1], l, dtype=dtype)
        elif defect == "strided":
            t = a[name]
            if t.dim() == 1 or min(t.shape) < 2:
                a[name] = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=dtype)[..., ::2]
            else:
                a[name] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
            if a[name].is_contiguous():
                return self.ffn_invalid()
        elif defect == "misaligned":
            t = a[name]
            buf = torch.empty(t.numel() + 8, dtype=dtype)
            step = self.pick(1, 2, 3) if t.element_size() == 2 else 1
            a[name] = buf[step:step + t.numel()].view(t.shape)
        elif defect == "activation":
            a["activation"] = self.pick("swish", "", "RELU", "relu\x00junk", "gelu ", "relu\ud800", 5, None, b"relu",
                                        ["relu"], "x" * 300)
        elif defect == "not_tensor":
            a[name] = self.pick(3, 1.5, "x", [[1.0]], None if name in ("x", "w_up", "w_down") else 7, {}, object())
        elif defect == "raw_capsule":
            a[name] = torch.utils.dlpack.to_dlpack(a[name])
        elif defect == "layout":
            a[name] = self.pick(lambda t: t.to_sparse(), lambda t: t.to("meta"),
                                lambda t: torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8),
                                lambda t: torch.nested.nested_tensor([t, t]))(a[name])
        elif defect == "plan_junk":
            a["plan"] = self.pick(5, "plan", {}, self.base_plans[0][1], [1])
        elif defect == "plan_other_chain":
            a["plan"] = self.fuser.plan(4, k + 8, n, target="h200")
        return self.ffn_case("ffn", f"invalid/{defect}", INVALID, a, dtype)

    # ---- foreign producers ----
    def ffn_foreign(self):
        np, dl = self.np, self.dl
        kind = self.pick("numpy", "exporter", "legacy", "version", "lanes", "strides", "offset", "null", "device",
                         "managed", "readonly_out", "copied_out", "raw", "dtype")
        m, k, n, l = self.pick(1, 4, 9), self.pick(8, 16), self.pick(16, 32), self.pick(8, 24)
        shapes = dict(x=(m, k), w_up=(n, k), w_down=(l, n))
        dtype = self.pick("float32", "float16", "bfloat16")
        tdt = getattr(self.torch, dtype)
        if kind == "numpy":
            npdt = self.pick(np.float32, np.float16)
            rs = np.random.default_rng(self.rng.randrange(2 ** 32))
            a = {k_: (rs.standard_normal(s) * (s[1] ** -0.5 if k_ != "x" else 1)).astype(npdt) for k_, s in
                 shapes.items()}
            a["activation"] = self.pick(*self.acts)
            if self.rng.random() < 0.5:
                a["out"] = np.empty((m, l), dtype=npdt)
            if self.rng.random() < 0.2:
                a["out"] = np.empty((m, l), dtype=npdt)
                a["out"].flags.writeable = False
                return self.ffn_case("foreign", "numpy/readonly_out", INVALID, a, getattr(self.torch, npdt.__name__))
            return self.ffn_case("foreign", "numpy", VALID, a, getattr(self.torch, npdt.__name__))
        ex = {name: dl.FakeExporter(self.producer, shape=s, dtype=dtype) for name, s in shapes.items()}
        label, expect = f"exporter/{kind}", INVALID
        name = self.pick("x", "w_up", "w_down")
        if kind in ("exporter", "legacy"):
            expect = VALID
            if kind == "legacy":
                ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, legacy_only=True)
        elif kind == "version":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, version=(2, 0))
        elif kind == "lanes":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, lanes=2)
        elif kind == "strides":
            s = shapes[name]
            ex[name] = dl.FakeExporter(self.producer, shape=s, dtype=dtype, strides=(1, s[0]) if s[0] > 1 else (s[1], 2))
        elif kind == "offset":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, byte_offset=self.pick(2, 4, 8))
        elif kind == "null":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, null_data=True)
        elif kind == "device":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, device=(self.pick(4, 7, 8, 14), 0))
        elif kind == "managed":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=dtype, device=(13, 0))
        elif kind in ("readonly_out", "copied_out"):
            ex["out"] = dl.FakeExporter(self.producer, shape=(m, l), dtype=dtype,
                                        flags=dl.FLAG_READ_ONLY if kind == "readonly_out" else dl.FLAG_IS_COPIED)
        elif kind == "raw":
            ex[name] = self.producer.capsule(shapes[name], dtype)[0]
        elif kind == "dtype":
            ex[name] = dl.FakeExporter(self.producer, shape=shapes[name], dtype=self.pick("float64", "int32"))
        a = dict(ex, activation=self.pick(*self.acts))
        if expect == VALID:
            zeros = {k_: self.torch.zeros(s, dtype=tdt) for k_, s in shapes.items()}

            def check(y):
                return self.close(y, self.reference(dict(zeros, activation=a["activation"])), tdt)
            return Case("foreign", label, VALID, lambda: self.fuser.ffn(**a), check)
        return Case("foreign", label, expect, lambda: self.fuser.ffn(**a))

    def huge_capsule(self, shape, dtype="bfloat16", strides=None):
        """A versioned capsule claiming `shape` over a 4 KiB buffer: fuser must refuse it from the
        metadata alone (a dimension of at least 2**31, an element count past int64, a negative extent)."""
        import ctypes
        dl = self.dl
        _, code, bits = dl.DTYPES[dtype]
        buf = self.np.zeros(4096 + 256, dtype=self.np.uint8)
        base = buf.ctypes.data + (-buf.ctypes.data) % 256
        shape_arr = (ctypes.c_int64 * len(shape))(*shape)
        strides_arr = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        mt = dl.DLManagedTensorVersioned()
        mt.version = dl.DLPackVersion(1, 0)
        t = mt.dl_tensor
        t.data, t.device, t.ndim = base, dl.DLDevice(dl.KDLCPU, 0), len(shape)
        t.dtype = dl.DLDataType(code, bits, 1)
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr else None
        keep = (mt, buf, shape_arr, strides_arr)

        class Huge:
            def __dlpack_device__(self):
                return (dl.KDLCPU, 0)

            def __dlpack__(self, **kw):
                self.keep = keep                      # alive as long as the exporter
                return dl._PyCapsule_New(ctypes.addressof(mt), b"dltensor_versioned", None)
        return Huge()

    def ffn_huge(self):
        torch = self.torch
        kind = self.pick("zero_numel", "expanded", "foreign_m", "foreign_k", "foreign_n", "overflow", "negative",
                         "bytes_overflow")
        dtype = self.pick(*self.dtypes)
        if kind == "zero_numel":                              # valid: nothing to compute, nothing allocated
            a = self.tensors(dtype, lead=self.pick((2 ** 40, 0), (0, 2 ** 40), (2 ** 20, 2 ** 20, 0)))
            return self.ffn_case("huge", kind, VALID, a, dtype)
        if kind == "expanded":
            a = self.tensors(dtype, lead=(3,))
            a["x"] = torch.zeros(1, a["x"].shape[-1], dtype=dtype).expand(2 ** 40, -1)
            return self.ffn_case("huge", kind, INVALID, a, dtype)
        k, n, l = 16, 32, 16
        big = self.pick(2 ** 31, 2 ** 40, 2 ** 62)
        shapes = dict(x=(4, k), w_up=(n, k), w_down=(l, n))
        if kind == "foreign_m":
            shapes["x"] = (big, k) if big < 2 ** 62 else (2 ** 31, 2 ** 31, k)
        elif kind == "foreign_k":
            shapes.update(x=(4, big), w_up=(n, big))
        elif kind == "foreign_n":
            shapes.update(w_up=(big, k), w_down=(l, big))
        elif kind == "overflow":
            shapes["x"] = (2 ** 40, 2 ** 40, k)
        elif kind == "negative":
            shapes["x"] = (-4, k)
        elif kind == "bytes_overflow":
            shapes["x"] = (2 ** 61 + 2 ** 60,) if self.rng.random() < 0.5 else (3, 2 ** 61)
        a = {name: self.huge_capsule(s) for name, s in shapes.items()}
        a["activation"] = "relu"
        return Case("huge", f"foreign/{kind}", INVALID, lambda: self.fuser.ffn(**a))

    # ---- the operator ----
    def op(self):
        torch = self.torch
        dtype = self.pick(*self.dtypes)
        a = self.tensors(dtype, lead=self.pick((), (0,), (1,), (3,), (2, 3)))
        expect, label = VALID, "valid"
        r = self.rng.random()
        if r < 0.5:
            defect = self.pick("dtype", "shape", "strided", "misaligned", "activation", "mixed")
            expect, label = INVALID, defect
            name = self.pick("x", "w_up", "w_down")
            t = a[name]
            if defect == "dtype":
                a[name] = t.to(self.pick(torch.float64, torch.int32))
            elif defect == "shape":
                a[name] = self.randn(*[s + 1 for s in t.shape], dtype=dtype)
            elif defect in ("strided", "misaligned"):
                if defect == "strided":
                    v = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=dtype)[..., ::2]
                else:
                    v = torch.empty(t.numel() + 8, dtype=dtype)[1:1 + t.numel()].view(t.shape)
                v.copy_(t)
                a[name] = v
                # the operator makes x contiguous and aligned (a copy where needed); weights must be so
                if name == "x" or v.is_contiguous() and defect == "strided":
                    expect = VALID
            elif defect == "activation":
                a["activation"] = self.pick("swish", "relu\x00x", "", "Gelu")
            elif defect == "mixed":
                a[name] = t.to(self.pick(*[d for d in self.dtypes if d != dtype]))
        args = [a.get(k) for k in ("x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down")]

        def call():
            return torch.ops.fuser.ffn(*args, a["activation"])

        def check(y):
            return self.close(y, self.reference(a), dtype)
        return Case("op", label, expect, call, check)

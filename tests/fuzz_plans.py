"""The fuzzer's calls of the planner (tests/test_fuzz.py): ``fuser.plan``/``fuser.plans`` with random
arguments, ``Plan.from_dict`` on tampered plan dicts, and ``fuser.ffn(plan=...)`` with the plans such
dicts give."""
from __future__ import annotations

import copy
import json
import math

from fuzz_tensors import EITHER, INVALID, VALID, Case


class PlanCalls:
    """Calls of the planner; mixed into test_fuzz.Fuzzer with TensorCalls."""

    # ---- the planner ----
    def plan(self):
        fuser = self.fuser
        kw, bad = {}, []

        def arg(name, good, junk, p_bad=0.12):
            if self.rng.random() < p_bad:
                bad.append(name)
                return self.rng.choice(junk)
            return self.rng.choice(good)
        ints_junk = (0, -1, 2 ** 31, 2 ** 63, 2 ** 64, -2 ** 63, 1.5, True, "64", None)
        m = arg("m", (1, 2, 16, 64, 128, 300), ints_junk)
        d_model = arg("d_model", (8, 64, 256, 768), ints_junk)
        d_ff = arg("d_ff", (16, 128, 1024, 3072), ints_junk)
        for name, good, junk in (
                ("d_out", (None, 64, 256), (0, -8, 2 ** 63, 2.0, "x")),
                ("gated", (False, True), ("no", "false", 1, None)),
                ("activation", self.acts, ("swish", "relu\x00junk", "", 3, None)),
                ("bias", (False, True, "up", ("up", "down"), None), (5, "left", [["up"]], {"up": 1})),
                ("dtype", ("bfloat16", "float16", "float32", self.torch.bfloat16), ("float64", "bfloat", "bfloat16\x00", 3)),
                ("target", (None, "h200", "h100", dict(self.builtins["h200"])),
                 ("a100", "h200\x00x", 5, dict(self.builtins["h200"], smem_per_block=-1),
                  dict(self.builtins["h200"], usable_sms=[2 ** 32] * 5), dict(self.builtins["h200"], hbm_gbs="x"))),
                ("fused", (None, None, True, False), ("no", 1, "yes")),
                ("cluster", (None, None, None, (1, 2, 1, 1), (1, 4, 2, 2), (2, 2, 1, 2)),
                 ((0, 1, 1, 1), (1.5, 1, 1, 1), (2 ** 32 + 2, 8, 1, 1), 5, (1, 2), "1111")),
                ("dataflows", (None, None, "shuffle", ["all_exchange"]), ("teleport", 5, [["shuffle"]])),
                ("bm", (None, None, 16, 64), (0, -16, 2 ** 63, 48.0)),
                ("bn", (None, None, 64, 128), (0, -16, 2 ** 40)),
                ("stages", (None, None, 2, 4), (0, -1, 9.5)),
                ("kind", (None, None, "cluster", "stream"), ("Stream", "stream\x00", 1)),
                ("order", (None, None, "n_outer", "l_outer"), ("sideways", "n_outer\x00x")),
        ):
            v = arg(name, good, junk, 0.06)
            if v is not None or name in bad:
                kw[name] = v
        many = self.rng.random() < 0.2
        if many:
            kw["k"] = arg("k", (1, 3, 10), (0, 65, 2 ** 63, 2.0))
        expect = INVALID if bad else EITHER
        label = "bad:" + ",".join(bad) if bad else "args"
        want = {k: kw[k] for k in ("bm", "bn", "stages", "kind", "order") if kw.get(k) is not None}
        if kw.get("cluster") is not None:
            want["cluster"] = tuple(kw["cluster"])

        def call():
            return (fuser.plans if many else fuser.plan)(m, d_model, d_ff, **kw)

        def check(res):
            for p in (res if many else [res]):
                if not isinstance(p, fuser.Plan):
                    return f"returned {type(p).__name__}"
                if p.fused:
                    got = dict(bm=p.tiles["bm"], bn=p.tiles["bn"], stages=p.stages, kind=p.kind, order=p.order,
                               cluster=p.cluster)
                    off = {k: (v, got[k]) for k, v in want.items() if got[k] != v}
                    if off:
                        return f"constraints not honoured: {off}"
                    if p.derived["smem_bytes"] > p.target["smem_per_block"]:
                        return "a plan over its target's shared memory"
                if fuser.Plan.from_dict(json.loads(json.dumps(p.to_dict())), target=p.target) != p:
                    return "JSON round trip changed the plan"
                p.explain(), p.summary()
            return None
        return Case("plan", label, expect, call, check)

    def _base_plans(self):
        fuser = self.fuser
        out = []
        for kw in (dict(m=16, d_model=64, d_ff=128, activation="relu", fused=True, kind="cluster"),
                   dict(m=8, d_model=64, d_ff=256, gated=True, activation="silu", fused=True, kind="stream", bm=16),
                   dict(m=32, d_model=128, d_ff=256, activation="gelu", bias=True, fused=True, kind="cluster",
                        cluster=(1, 2, 2, 2)),
                   dict(m=4, d_model=32, d_ff=64, gated=True, activation="gelu_tanh", bias=True, fused=False),
                   dict(m=24, d_model=64, d_ff=128, activation="silu")):
            m, d, f = kw.pop("m"), kw.pop("d_model"), kw.pop("d_ff")
            p = fuser.plan(m, d, f, target="h200", **kw)
            out.append((p, json.loads(json.dumps(p.to_dict()))))
        return out

    # ---- tampered plan dicts ----
    PATHS = (("chain", "m"), ("chain", "d_model"), ("chain", "d_ff"), ("chain", "d_out"), ("chain", "gated"),
             ("chain", "bias_up"), ("chain", "bias_gate"), ("chain", "bias_down"), ("chain", "activation"),
             ("chain", "dtype"), ("fused",), ("params", "kind"), ("params", "cluster"), ("params", "bm"),
             ("params", "bn"), ("params", "bl"), ("params", "n_iters"), ("params", "stages"), ("params", "order"),
             ("params", "gate_mode"), ("params", "s1"), ("params", "s2"), ("search", "candidates"),
             ("search", "search_ms"), ("target", "smem_per_block"), ("target", "name"), ("target", "max_cluster"),
             ("target", "regs_per_sm"), ("derived", "smem_bytes"), ("cost", "total"), ("traffic", "hbm"))
    VALUES = (0, 1, -1, 2, 8, 16, 32, 64, 128, 192, 256, 4096, 2 ** 31, 2 ** 32 + 2, 2 ** 63, -2 ** 63, 2 ** 64,
              1.5, 64.0, float("nan"), float("inf"), True, False, None, "cluster", "stream", "n_outer", "l_outer",
              "none", "spatial", "sequential", "relu", "gelu", "silu", "bfloat16", "float16", "float32", "no",
              "false", "", "relu\x00junk", "cluster\x00", "h200", "h100", "x" * 500, [1, 1, 1, 1], [2, 8, 1, 1],
              [1, 2, 2, 2], [2 ** 32 + 2, 8, 1, 1], [1.5, 1, 1, 1], [0, 1, 1, 1], [], {}, [1] * 5, (1, 4, 2, 2))

    #: what the core accepts at all for each field of a plan dict (fuser_plan_derive may still refuse)
    INTS = {"m": (0, 2 ** 31 - 1), "d_model": (1, 2 ** 31 - 1), "d_ff": (1, 2 ** 31 - 1),
            "d_out": (1, 2 ** 31 - 1), "bm": (16, 128), "bn": (32, 256), "bl": (32, 256), "n_iters": (1, 4096),
            "stages": (1, 8), "s1": (0, 4096), "s2": (0, 4096)}
    STRS = {"activation": ("relu", "gelu", "gelu_tanh", "silu"), "dtype": ("bfloat16", "float16", "float32", "bf16", "fp16", "half", "fp32", "float"),
            "kind": ("cluster", "stream"), "order": ("n_outer", "l_outer"),
            "gate_mode": ("none", "spatial", "sequential")}

    def malformed(self, d, seen=()):
        """Why plan dict `d` must be refused whatever its values mean (None: it may be accepted): a
        missing or mistyped field, an int outside what the field can hold, an unknown name."""
        def bad_int(v, key):
            lo, hi = self.INTS[key]
            return not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi

        if not isinstance(d, dict):
            return "not a dict"
        if id(d) in seen:
            return "cycle"
        c = d.get("chain")
        if not isinstance(c, dict):
            return "chain"
        for key in ("m", "d_model", "d_ff", "d_out"):
            if key not in c or bad_int(c[key], key):
                return f"chain.{key}"
        for key in ("activation", "dtype"):
            if c.get(key) not in self.STRS[key] or not isinstance(c.get(key), str):
                return f"chain.{key}"
        for key in ("gated", "bias_up", "bias_gate", "bias_down"):
            if key in c and not isinstance(c[key], bool):
                return f"chain.{key}"
        if c.get("bias_gate") is True and c.get("gated") is not True:
            return "bias_gate without gated"
        if "fused" in d and not isinstance(d["fused"], bool):
            return "fused"
        if d.get("fused") is True:
            p = d.get("params")
            if not isinstance(p, dict):
                return "params"
            if c["m"] < 1 or c["dtype"] in ("float32", "fp32", "float"):
                return "fused chain"
            cl = p.get("cluster")
            if not (isinstance(cl, (list, tuple)) and len(cl) == 4 and all(
                    isinstance(e, int) and not isinstance(e, bool) and 1 <= e <= 16 for e in cl)):
                return "params.cluster"
            for key in ("bm", "bn", "bl", "n_iters", "stages", "s1", "s2"):
                if (key in p or key not in ("s1", "s2")) and (key not in p or bad_int(p[key], key)):
                    return f"params.{key}"
            for key in ("kind", "order", "gate_mode"):
                if (key in p or key != "kind") and (p.get(key) not in self.STRS[key] or not isinstance(p.get(key), str)):
                    return f"params.{key}"
        s = d.get("search", {})
        if not isinstance(s, dict):
            return "search"
        for key, kinds in (("candidates", (int,)), ("scored", (int,)), ("search_ms", (int, float)),
                           ("floor_us", (int, float))):
            v = s.get(key, 0)
            if not isinstance(v, kinds) or isinstance(v, bool) or not (math.isfinite(v) and v >= 0):
                return f"search.{key}"
        r = d.get("runner_up")
        return None if r is None else self.malformed(r, seen + (id(d),)) or None

    def tampered(self):
        """A base plan dict with 1-3 random edits: (dict, label, why it must be refused or None)."""
        _, d = self.pick(*self.base_plans)
        d = copy.deepcopy(d)
        labels = []
        for _ in range(self.pick(1, 1, 2, 3)):
            op = self.pick(*["set"] * 6, "delete", "delete", "junk_section", "junk_section", "runner_up", "cycle")
            if op == "set":
                path = self.pick(*self.PATHS)
                node = d
                for key in path[:-1]:
                    node = node.get(key) if isinstance(node, dict) else None
                if isinstance(node, dict):
                    node[path[-1]] = copy.deepcopy(self.pick(*self.VALUES))
                    labels.append("set " + ".".join(path))
            elif op == "delete":
                path = self.pick(*self.PATHS, ("chain",), ("target",), ("search",), ("params",))
                node = d
                for key in path[:-1]:
                    node = node.get(key) if isinstance(node, dict) else None
                if isinstance(node, dict) and path[-1] in node:
                    del node[path[-1]]
                    labels.append("delete " + ".".join(path))
            elif op == "cycle":
                d["runner_up"] = d
                labels.append("cycle")
                break
            elif op == "junk_section":
                key = self.pick("chain", "params", "search", "runner_up", "target")
                d[key] = self.pick(5, "x", [1, 2], None)
                labels.append("junk " + key)
            elif op == "runner_up":
                d["runner_up"] = copy.deepcopy(self.pick(*self.base_plans)[1])
                labels.append("runner_up")
        return d, "+".join(labels) or "untouched", self.malformed(d)

    def check_loaded(self, p):
        fuser = self.fuser
        if not isinstance(p, fuser.Plan):
            return f"returned {type(p).__name__}"
        if p.target not in (self.builtins["h200"], self.builtins["h100"]) and p.target != self.default_target:
            return f"checked against a target that is not the machine's: {p.target.get('name')}"
        if p.fused and p.derived["smem_bytes"] > p.target["smem_per_block"]:
            return "a plan over the shared memory of the GPU it was checked against"
        p.explain(), p.summary(), p.to_svg() if p.fused else None
        if fuser.Plan.from_dict(json.loads(json.dumps(p.to_dict()))) != p:
            return "JSON round trip changed the plan"
        return None

    def from_dict(self):
        d, label, bad = self.tampered()
        return Case("from_dict", label + (f" ({bad})" if bad else ""), INVALID if bad else EITHER,
                    lambda: self.fuser.Plan.from_dict(d), self.check_loaded)

    def ffn_plan(self):
        """fuser.ffn(plan=...) with a plan from a tampered dict, on tensors of the plan's chain."""
        d, label, bad = self.tampered()
        try:
            p = self.fuser.Plan.from_dict(d)
        except Exception:  # noqa: BLE001 (from_dict itself is judged in from_dict(); here a plan is needed)
            p = None
        if p is None or p.chain["d_ff"] * (p.chain["d_model"] + p.chain["d_out"]) > 2 ** 22:
            p, label = self.pick(*self.base_plans)[0], "base"
        c = p.chain
        dtype = getattr(self.torch, c["dtype"])
        bias = {n for n in ("up", "gate", "down") if c[f"bias_{n}"]}
        a = self.tensors(dtype, gated=c["gated"], bias=bias, lead=(self.pick(c["m"], c["m"], 1, 0),),
                         dims=(c["d_model"], c["d_ff"], c["d_out"]))
        a["activation"], a["plan"] = c["activation"], p   # a plan from_dict accepted runs
        return self.ffn_case("ffn_plan", label, VALID, a, dtype)

"""The planner in Python: ``fuser.plan`` / ``fuser.plans`` search the plan space of one FFN in the C core
and return ``fuser.Plan`` objects that explain themselves, round-trip through JSON, and run on the CPU
plan interpreter (``fuser.simulate``)."""
from __future__ import annotations

import json
import math

import torch

from fuser import _C, svg
from fuser.target import default_target

__all__ = ["DATAFLOWS", "CHAIN_FIELDS", "Plan", "plan", "plans", "search", "simulate", "default_target"]

#: The dataflow primitives, in the order plans list them.
DATAFLOWS = ("all_exchange", "shuffle", "reduce_scatter", "inter_cluster_reduce")
_DF_BIT = {name: 1 << i for i, name in enumerate(DATAFLOWS)}
#: The stream kernel's cluster pairs, as plan summaries name them: units of two row tiles sharing the weight
#: tiles, or of two tiles sharing the token tile.
_STREAM_PAIRS = {(2, 1, 1, 1): " (row-tile pairs share weight tiles)", (1, 2, 1, 2): " (tile pairs share token tiles)"}
_CONSTRAINT_KEYS = ("bm", "bn", "bl", "n_iters", "stages", "order", "gate_mode", "kind", "s1", "s2", "phases", "lspan")
#: The fields of a chain dict the core plans from (``_C.ffn_check`` adds where the tensors are).
CHAIN_FIELDS = ("m", "d_model", "d_ff", "d_out", "gated", "activation", "bias_up", "bias_gate", "bias_down", "dtype",
                "packed")


def _chain(m, d_model, d_ff, d_out, gated, activation, bias, dtype, packed=False):
    d_out = d_model if d_out is None else d_out
    if not isinstance(packed, bool):
        raise TypeError(f"packed: expected True or False, got {type(packed).__name__}")
    for name, v in (("m", m), ("d_model", d_model), ("d_ff", d_ff), ("d_out", d_out)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected a str, got {type(activation).__name__}")
    if not isinstance(gated, bool):
        raise TypeError(f"gated: expected True or False, got {type(gated).__name__}")
    dtype = str(dtype).replace("torch.", "")
    if bias is None or isinstance(bias, bool):
        names = {"up", "gate", "down"} if bias else set()
    elif isinstance(bias, str) or (isinstance(bias, (tuple, list, set, frozenset))
                                   and all(isinstance(b, str) for b in bias)):
        names = {bias} if isinstance(bias, str) else set(bias)
        if not names <= {"up", "gate", "down"}:
            raise ValueError(f"bias: expected True/False or names among 'up', 'gate', 'down', got {bias!r}")
    else:
        raise TypeError(f"bias: expected True/False or names among 'up', 'gate', 'down', got {type(bias).__name__}")
    return dict(m=m, d_model=d_model, d_ff=d_ff, d_out=d_out, gated=gated, activation=activation,
                bias_up="up" in names, bias_gate="gate" in names and gated, bias_down="down" in names, dtype=dtype,
                packed=packed)


def _constraints(fused, cluster, dataflows, avoid, kw):
    """The search constraints of ``plan``'s keyword arguments; the core checks each value's type and
    range (a cluster extent of 0 or 1.5 is refused, never read as "free" or truncated)."""
    cons = {}
    if fused is not None:
        if not isinstance(fused, bool):
            raise TypeError(f"fused: expected True, False or None, got {type(fused).__name__}")
        cons["fused"] = int(fused)
    if cluster is not None:
        if not isinstance(cluster, (tuple, list)):
            raise TypeError(f"cluster: expected (cls_m, cls_n, cls_k, cls_l), got {type(cluster).__name__}")
        if len(cluster) != 4:
            raise ValueError(f"cluster: expected (cls_m, cls_n, cls_k, cls_l), got {cluster!r}")
        cons.update(zip(("cls_m", "cls_n", "cls_k", "cls_l"), cluster))
    for arg, key, names in (("dataflows", "dataflows_all", dataflows), ("avoid", "dataflows_none", avoid)):
        if names is None:
            continue
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, (tuple, list, set, frozenset)):
            raise TypeError(f"{arg}: expected dataflow names, got {type(names).__name__}")
        bits = 0
        for n in names:
            if not isinstance(n, str) or n not in _DF_BIT:
                raise ValueError(f"{arg}: unknown dataflow {n!r}; expected one of {', '.join(DATAFLOWS)}")
            bits |= _DF_BIT[n]
        if bits:
            cons[key] = bits
    for k, v in kw.items():
        if k not in _CONSTRAINT_KEYS:
            raise TypeError(f"plan() got an unexpected keyword argument {k!r}")
        if v is not None:
            cons[k] = v
    return cons or None


def plans(m, d_model, d_ff, *, d_out=None, gated=False, activation="gelu", bias=False, dtype="bfloat16",
          packed=False, target=None, k=10, fused=None, cluster=None, dataflows=None, avoid=None, **tiles):
    """The ``k`` best plans for one FFN, fastest predicted first.

    Arguments as for :func:`plan`; ``k`` is at most 64.

    Example:
        >>> import fuser
        >>> ps = fuser.plans(128, 4096, 14336, gated=True, activation="silu", k=3)
        >>> [p.predicted_us <= q.predicted_us for p, q in zip(ps, ps[1:])]
        [True, True]
    """
    chain = _chain(m, d_model, d_ff, d_out, gated, activation, bias, dtype, packed)
    return search(chain, default_target() if target is None else target, k,
                  _constraints(fused, cluster, dataflows, avoid, tiles))


def search(chain, target, k=10, constraints=None):
    """The `k` best plans for a chain dict (``CHAIN_FIELDS``; extra keys are ignored) on `target` (a
    built-in name or a target dict), fastest predicted first: the core's search, unchecked arguments.

    Example:
        >>> import fuser
        >>> from fuser.planner import search
        >>> chain = fuser.plan(16, 768, 3072).chain
        >>> search(chain, "h200", k=1)[0].summary() == fuser.plan(16, 768, 3072, target="h200").summary()
        True
    """
    found, stats = _C.search({f: chain[f] for f in CHAIN_FIELDS if f in chain}, target, k=k, constraints=constraints)
    return [Plan(c, stats) for c in found]


def plan(m, d_model, d_ff, *, d_out=None, gated=False, activation="gelu", bias=False, dtype="bfloat16",
         packed=False, target=None, fused=None, cluster=None, dataflows=None, avoid=None, **tiles):
    """Plan one FFN: how ``fuser.ffn`` would run it on ``target``.

    Args:
        m: tokens; d_model, d_ff: the FFN's widths; d_out: output width (default d_model).
        gated: SwiGLU/GeGLU form; activation: "relu", "gelu", "gelu_tanh" or "silu"; bias: all biases
            (True) or none (False), or the names of those present, e.g. ("up", "down").
        dtype: "bfloat16" or "float16" (float32 chains always run unfused).
        packed: a gated chain whose gate and up weights are the two row halves of one tensor (as
            ``FusedFFN`` packs them, or one Linear of both): its eager route runs one GEMM of both, and is
            priced so; ``fuser.ffn`` sets it from the tensors it is given.
        target: a built-in name ("h200", "h100"), a dict of target fields, or None for this machine's
            GPU (the H200 defaults without one).
        fused: force (True) or forbid (False) fusion; cluster: force (cls_m, cls_n, cls_k, cls_l) (a
            stream plan's: (1, 1, 1, 1), or a pair sharing an operand by multicast, (2, 1, 1, 1) or
            (1, 2, 1, 2), offered only when asked for);
        dataflows / avoid: dataflow names the plan must use / must not use;
        bm, bn, bl, n_iters, stages, order ("n_outer"/"l_outer"), gate_mode ("spatial"/"sequential"),
            kind ("cluster"/"stream"), s1, s2 (a stream plan's K splits), phases (a stream plan's 2, or 1:
            each unit computes its own H), lspan (one phase: output tiles per unit; above 1, GEMM1 runs once
            for all of them, and with bm 16 or 32 s2 may exceed 16): force a tile or schedule parameter.

    Returns a :class:`Plan`; ``plan.explain()`` says why it was chosen over the runner-up.

    Example:
        >>> import fuser
        >>> p = fuser.plan(128, 4096, 14336, gated=True, activation="silu")
        >>> p.search_ms < 1000 and p.predicted_us > 0
        True
    """
    ps = plans(m, d_model, d_ff, d_out=d_out, gated=gated, activation=activation, bias=bias, dtype=dtype,
               packed=packed, target=target, k=24, fused=fused, cluster=cluster, dataflows=dataflows, avoid=avoid,
               **tiles)
    best = ps[0]
    best._runner_up = next((p for p in ps[1:] if p._shape_key() != best._shape_key()), None)
    return best


_MAX_RUNNER_UPS = 16   # to_dict writes one; deeper chains only come from hand-made dicts


def _checked_target(target, trust):
    """The target a plan dict is checked against, as a target dict. A caller's own target (`trust`) is
    taken as given (the core checks its fields); a target read from the plan dict only chooses among
    the built-ins by its name, and otherwise this machine's target is used."""
    builtins = _C.targets()
    if trust:
        if isinstance(target, dict):
            return dict(target)
        if not isinstance(target, str):
            raise TypeError(f"target: expected a name or a dict, got {type(target).__name__}")
        if target not in builtins:
            raise ValueError(f"target: unknown target {target!r}; expected one of {', '.join(builtins)} or a dict")
        return builtins[target]
    name = target.get("name") if isinstance(target, dict) else target
    if isinstance(name, str) and name in builtins:
        return builtins[name]
    t = default_target()
    return builtins[t] if isinstance(t, str) else t


def _search_stats(s):
    """The search statistics a plan dict carries (what ``explain`` prints), checked: counts are
    non-negative ints, times non-negative finite numbers, ``pruned`` maps rule names to counts."""
    if not isinstance(s, dict):
        raise TypeError(f"plan: 'search' must be a dict, got {type(s).__name__}")
    out = {}
    for key, kinds in (("candidates", (int,)), ("scored", (int,)), ("search_ms", (int, float)),
                       ("floor_us", (int, float))):
        v = s.get(key, 0)
        if not isinstance(v, kinds) or isinstance(v, bool):
            raise TypeError(f"plan: search '{key}' must be a non-negative {kinds[-1].__name__}, got "
                            f"{type(v).__name__}")
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"plan: search '{key}' must be a non-negative {kinds[-1].__name__}, got {v!r}")
        out[key] = v
    pruned = s.get("pruned", {})
    if not isinstance(pruned, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                               and v >= 0 for k, v in pruned.items()):
        raise TypeError("plan: search 'pruned' must map rule names to non-negative int counts")
    out["pruned"] = pruned
    return out


class Plan:
    """How one FFN runs on one GPU: fused (cluster shape, tiles, dataflows) or unfused, with its predicted
    time broken down by component and the bytes it moves per memory level.

    Attributes: ``fused``, ``dataflow`` (e.g. "shuffle+inter_cluster_reduce"), ``dataflows`` (tuple),
    ``cluster`` (cls_m, cls_n, cls_k, cls_l), ``tiles`` (dict), ``stages``, ``order``, ``gate_mode``,
    ``predicted_us``, ``traffic`` (bytes: hbm, l2, dsm, smem), ``breakdown`` (microseconds by component),
    ``candidates``, ``pruned`` (rule -> candidates removed), ``search_ms``, ``floor_us``, ``chain``,
    ``derived`` (grid, buffers, barriers), ``target``; ``core``: the core's own plan (``fuser._C.Plan``) that it
    wraps, ``raw`` its fields as a dict. Made by ``fuser.plan``/``fuser.plans`` and ``Plan.from_dict``.
    """

    def __init__(self, core, stats=None):
        if not isinstance(core, _C.Plan):
            raise TypeError(f"Plan: expected the core's plan (a fuser._C.Plan, from _C.search or _C.derive), got "
                            f"{type(core).__name__}; a plan dict becomes a Plan through Plan.from_dict")
        self._core = core
        self._d = core.to_dict()
        stats = stats or {}
        self.candidates = stats.get("candidates", 0)
        self.scored = stats.get("scored", 0)
        self.pruned = dict(stats.get("pruned", {}))
        self.search_ms = stats.get("search_ms", 0.0)
        self.floor_us = stats.get("floor_us", 0.0)
        self.target = stats.get("target", {})
        self._runner_up = None

    def __getstate__(self):
        # the kernel loaded per device (fuser.runtime.launch_for keeps it here) belongs to this process
        state = dict(self.__dict__)
        state.pop("_launch", None)
        return state

    # ---- attributes ----
    chain = property(lambda self: dict(self._d["chain"]))
    fused = property(lambda self: self._d["fused"])
    dataflow = property(lambda self: self._d["dataflow"])
    dataflows = property(lambda self: tuple(self._d.get("dataflows", ())))
    traffic = property(lambda self: dict(self._d["traffic"]))
    derived = property(lambda self: dict(self._d.get("derived", {})))
    predicted_us = property(lambda self: self._d["cost"]["total"])

    @property
    def raw(self):
        """The core's plan as a dict (what ``to_dict`` writes, less the search and target); read only."""
        return self._d

    @property
    def core(self):
        """The core's plan (a ``fuser._C.Plan``), as ``fuser._C`` takes it: code generation, loading a kernel,
        the plan interpreter."""
        return self._core

    @property
    def breakdown(self):
        c = self._d["cost"]
        return {k: c[k] for k in ("launch", "compute", "hbm", "l2", "dsm", "smem", "sync", "tail", "total")}

    @property
    def cluster(self):
        return tuple(self._d["params"]["cluster"]) if self.fused else None

    @property
    def tiles(self):
        if not self.fused:
            return None
        p = self._d["params"]
        return {"bm": p["bm"], "bn": p["bn"], "bl": p["bl"], "n_iters": p["n_iters"], "bk": 64}

    kind = property(lambda self: self._d["params"].get("kind", "cluster") if self.fused else None)
    splits = property(lambda self: (self._d["params"]["s1"], self._d["params"]["s2"]) if self.fused else None)
    stages = property(lambda self: self._d["params"]["stages"] if self.fused else None)
    order = property(lambda self: self._d["params"]["order"] if self.fused else None)
    gate_mode = property(lambda self: self._d["params"]["gate_mode"] if self.fused else None)
    runner_up = property(lambda self: self._runner_up)

    def _shape_key(self):
        if not self.fused:
            return ("unfused",)
        p = self._d["params"]
        if self.kind == "stream":  # one family, told apart by its tiles, splits and pairs
            return ("stream", p["bm"], p["bn"], p["bl"], p["s1"], p["s2"], tuple(p["cluster"]), p["phases"],
                    p.get("lspan", 1))
        return (self.dataflow, tuple(p["cluster"]), p["order"], p["gate_mode"])

    # ---- serialisation ----
    def to_dict(self):
        """A JSON-able dict; :meth:`from_dict` re-validates and re-derives it."""
        d = json.loads(json.dumps(self._d))
        d["search"] = {"candidates": self.candidates, "scored": self.scored, "pruned": self.pruned,
                       "search_ms": self.search_ms, "floor_us": self.floor_us}
        d["target"] = self.target
        if self._runner_up is not None:
            d["runner_up"] = self._runner_up.to_dict()
        return d

    @classmethod
    def from_dict(cls, d, target=None):
        """Rebuild a plan from :meth:`to_dict`'s output (e.g. after ``json.loads``). The core checks every
        field (exact types and strings, ranges; no coercion) and the plan against `target`'s limits, and
        recomputes every derived number, so a stale or edited plan cannot describe something other than
        what will run.

        `target` is the GPU to check against: a built-in name ("h200", "h100") or a target dict. By
        default it is the built-in the dict's own target names, else this machine's
        (``default_target()``); the target carried in the dict is never trusted for its limits, so
        raising its ``smem_per_block`` does not let a plan through that the GPU cannot run.

        Example:
            >>> import json, fuser
            >>> p = fuser.plan(64, 768, 3072, activation="gelu")
            >>> q = fuser.Plan.from_dict(json.loads(json.dumps(p.to_dict())))
            >>> q.to_dict() == p.to_dict()
            True
        """
        if not isinstance(d, dict):
            raise TypeError(f"Plan.from_dict: expected a dict, got {type(d).__name__}")
        target = _checked_target(d.get("target") if target is None else target, trust=target is not None)
        plans, seen, where = [], set(), ""
        while True:
            if id(d) in seen:
                raise ValueError("runner_up: a plan dict's runner_up refers back to itself or to a plan that "
                                 "leads to it (a cycle)")
            if len(plans) > _MAX_RUNNER_UPS:
                raise ValueError(f"runner_up: nested more than {_MAX_RUNNER_UPS} deep")
            seen.add(id(d))
            try:
                stats = _search_stats(d.get("search", {}))
                p = cls(_C.derive(d, target), dict(stats, target=target))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where}{e}") from None
            plans.append(p)
            d, where = d.get("runner_up"), where + "runner_up: "
            if d is None:
                break
            if not isinstance(d, dict):
                raise TypeError(f"{where}expected a plan dict or None, got {type(d).__name__}")
        for p, r in zip(plans, plans[1:]):
            p._runner_up = r
        return plans[0]

    def check(self, target=None, m=None):
        """Check this plan against `target`, the GPU it is to run on (a built-in name or a target dict;
        default ``default_target()``), for `m` tokens (default: the plan's own): the core re-derives it
        and raises ValueError naming the first rule or hardware limit it breaks (tile divisibility,
        shared memory, cluster size, registers, workspace). ``fuser.ffn(plan=...)`` calls it before any
        code is generated. Returns the re-derived plan dict.

        Example:
            >>> import fuser
            >>> p = fuser.plan(16, 1024, 4096, fused=True, kind="stream", bm=16, target="h200")
            >>> p.check("h200", m=16)["derived"] == p.derived
            True
            >>> _ = p.check("h200", m=17)   # two row tiles of 16 tokens
            >>> p.check("h200", m=2**31 - 1)
            Traceback (most recent call last):
              ...
            ValueError: plan: stream plan: 2147483647 tokens in row tiles of 16 make more work units than the kernel's int32 counters hold; use bm = 128 or fewer tokens per call
        """
        target = default_target() if target is None else target
        d = _C.derive(self._core, target).to_dict()
        if m is not None and d["fused"] and m != d["chain"]["m"] and not (isinstance(m, int) and m < 1):
            _C.derive(dict(d, chain=dict(d["chain"], m=m)), target)
        return d

    def __eq__(self, other):
        return isinstance(other, Plan) and self.to_dict() == other.to_dict()

    # ---- text ----
    def describe_chain(self):
        """The FFN this plan is for, in words: tokens, widths, form, biases and dtype."""
        c = self._d["chain"]
        form = ("gated " if c["gated"] else "") + c["activation"] + (" (gate and up packed)" if c.get("packed") else "")
        bias = "with biases" if c["bias_up"] or c["bias_down"] else "no bias"
        return (f"{c['m']} tokens, d_model {c['d_model']}, d_ff {c['d_ff']} -> d_out {c['d_out']}, {form}, {bias}, "
                f"{c['dtype']}")

    def summary(self):
        """One line: the choice and its predicted time."""
        if not self.fused:
            return f"unfused (PyTorch eager ops), predicted {self.predicted_us:.1f} us"
        p = self._d["params"]
        if self.kind == "stream":
            span = p.get("lspan", 1)
            return (f"fused stream, bm={p['bm']} bn={p['bn']} bl={p['bl']}, splits {p['s1']}/{p['s2']}, "
                    f"{p['stages']} stages{_STREAM_PAIRS.get(tuple(p['cluster']), '')}"
                    f"{', one phase' if p['phases'] == 1 else ''}"
                    f"{f', {span} l-tiles per unit' if span > 1 else ''}, "
                    f"predicted {self.predicted_us:.1f} us")
        return (f"fused {self.dataflow}, cluster {tuple(p['cluster'])}, bm={p['bm']} bn={p['bn']}x{p['n_iters']} "
                f"bl={p['bl']}, {p['stages']} stages, {p['order']}"
                + (f", gate {p['gate_mode']}" if p["gate_mode"] != "none" else "")
                + f", predicted {self.predicted_us:.1f} us")

    def __repr__(self):
        return f"<fuser.Plan {self.summary()}>"

    def describe_dataflows(self):
        """(dataflow, one line saying what it does in this plan) per dataflow used, or ("local", ...)."""
        d, p = self.derived, self._d["params"]
        lines = []
        if "all_exchange" in self.dataflows:
            op = "multiply gate by up" if p["gate_mode"] == "spatial" else "add their K-split partials"
            lines.append(("all_exchange", f"all_exchange: {p['cluster'][2]} blocks per H tile {op} over DSM "
                          f"({d['parts']} fp32 tile(s) of {p['bm']}x{p['bn']} per block per chunk)"))
        if "shuffle" in self.dataflows:
            lines.append(("shuffle", f"shuffle: rings of {d['cls_shuffle']} blocks pass their H slices around, so "
                          f"each multiplies {d['cls_shuffle'] * d['nb']} d_ff columns with its own W_down columns"))
        if "reduce_scatter" in self.dataflows:
            lines.append(("reduce_scatter", f"reduce_scatter: {d['cls_reduce']} groups sum partial output tiles over "
                          f"DSM; each block stores a {p['bm']}x{d['sw']} share"))
        if "inter_cluster_reduce" in self.dataflows:
            lines.append(("inter_cluster_reduce", f"inter_cluster_reduce: {d['grid_n']} clusters along d_ff sum fp32 "
                          f"partials through a {d['workspace_bytes'] / 1e6:.1f} MB workspace; the last to arrive adds "
                          f"them in order (deterministic)"))
        if not lines:
            lines.append(("local", "no inter-block exchange: each block computes whole output tiles on its own"))
        return lines

    def _bound(self):
        """The largest time term and its value: what the plan waits on (a fused plan's terms overlap and the
        largest sets its time; an unfused plan's add up, one kernel after another)."""
        b = self.breakdown
        keys = ("compute", "hbm", "l2", "dsm", "smem")
        top = max(keys, key=lambda k: b[k])
        return top, b[top]

    def explain(self):
        """A readable account of the choice, its predicted time and traffic, and the runner-up."""
        b, tr = self.breakdown, self.traffic
        out = [f"FFN: {self.describe_chain()}; target {self.target.get('name', '?')}"]
        if self.fused and self.kind == "stream":
            d, p = self.derived, self._d["params"]
            out.append("Choice: fused, stream: one persistent launch streams every weight byte once on the whole GPU")
            if p["phases"] == 1:
                span = p.get("lspan", 1)
                out.append(f"  one phase: {d['lt2']} tiles of {p['bl']} output columns, {span} per unit, x {p['s2']} "
                           f"d_ff split(s); each unit first computes the H columns of its d_ff range for up to "
                           f"{p['bm']} tokens itself (in tiles of {p['bn']}, into shared memory: GEMM1 runs once per "
                           f"unit), then its output tiles; split partials are summed in a fixed order (deterministic)")
                if span == d["lt2"] > 1 and p["bm"] < 64 and p["s2"] > 1:
                    out.append(f"  each unit's l-tiles are shared: blocks without a unit take some (the slice's H from "
                               f"an L2 buffer), so {d['units']} work units count the units and their l-tiles")
            else:
                out.append(f"  phase 1: {d['nt1']} tiles of {p['bn']} d_ff columns x {p['s1']} K split(s) compute H "
                           f"for up to {p['bm']} tokens into a buffer that stays in L2")
                out.append(f"  phase 2: {d['lt2']} tiles of {p['bl']} output columns x {p['s2']} d_ff split(s) start as "
                           f"soon as their H columns are ready; split partials are summed in order (deterministic)")
            if tuple(p["cluster"]) in _STREAM_PAIRS:
                out.append(f"  units run in cluster pairs{_STREAM_PAIRS[tuple(p['cluster'])]}: each block loads half of "
                           f"the shared tile for both (TMA multicast), so L2 serves it once")
            out.append(f"  {d['units']} work units on {self._d['cost']['sms_used']} SMs, {p['stages']} pipeline stages, "
                       f"shared memory {d['smem_bytes']} B per block, workspace {d['workspace_bytes'] / 1e6:.2f} MB")
        elif self.fused:
            d, p = self.derived, self._d["params"]
            out.append("Choice: fused, " + self.dataflow)
            out.append(f"  cluster (cls_m, cls_n, cls_k, cls_l) = {tuple(p['cluster'])}: {d['cluster_size']} blocks; "
                       f"{d['grid_n']} cluster(s) along d_ff x {d['grid_m']} along tokens = {d['blocks']} blocks, "
                       f"{self._d['cost']['waves']} wave(s) on {self._d['cost']['sms_used']} SMs")
            order = ("outputs stay in registers while d_ff streams (n_outer)" if p["order"] == "n_outer"
                     else "each block keeps its whole H slice in shared memory, then loops over outputs (l_outer)")
            gate = {"none": "", "spatial": "; gate and up on different blocks",
                    "sequential": "; gate and up in the same block"}[p["gate_mode"]]
            out.append(f"  tiles: {p['bm']} token rows x {p['bn']} d_ff columns x {p['n_iters']} chunk(s), output "
                       f"chunks of {p['bl']}; {p['stages']} pipeline stages; {order}{gate}")
            out.append(f"  shared memory {d['smem_bytes']} B per block, ~{d['regs_est']} registers per thread, "
                       f"{d['barriers']} cluster barriers")
            out += ["  " + line for _, line in self.describe_dataflows()]
        else:
            out.append("Choice: unfused: PyTorch eager ops (library GEMMs, the intermediate through HBM)")
            if self.chain["gated"] and self.chain["dtype"] in ("bfloat16", "float16"):
                out.append("  on a Hopper GPU without autograd, the activation and the product run as fuser's gate "
                           "kernel (one pass, same result; the prediction counts PyTorch's two ops)")
            elif self._d.get("eager_epilogue"):
                out.append("  on a Hopper GPU without autograd, the activation runs in the up GEMM's cuBLASLt epilogue "
                           "(over the up bias, or a zero bias in its place; the prediction counts it there)")
        top, val = self._bound()
        if self.fused:
            out.append(f"  predicted {b['total']:.1f} us = launch {b['launch']:.1f} + max(compute {b['compute']:.1f}, "
                       f"hbm {b['hbm']:.1f}, l2 {b['l2']:.1f}, dsm {b['dsm']:.1f}, smem {b['smem']:.1f}) + sync "
                       f"{b['sync']:.1f} + tail {b['tail']:.1f}; bound by {top}")
        else:   # one kernel after another: the terms add up
            out.append(f"  predicted {b['total']:.1f} us = launch {b['launch']:.1f} + compute {b['compute']:.1f} "
                       f"(GEMMs bound by their FLOPs) + hbm {b['hbm']:.1f} (GEMMs bound by their bytes, elementwise "
                       f"passes); bound by {top}")
        out.append(f"  traffic: HBM {tr['hbm'] / 1e6:.1f} MB, L2 {tr['l2'] / 1e6:.1f} MB, DSM {tr['dsm'] / 1e6:.1f} MB, "
                   f"shared memory {tr['smem'] / 1e6:.1f} MB")
        if self.floor_us:
            out.append(f"  roofline floor {self.floor_us:.1f} us: predicted {b['total'] / self.floor_us:.2f}x the floor")
        r = self._runner_up
        if r is not None:
            delta = r.predicted_us - self.predicted_us
            key = "stream_margin" if r.kind == "stream" else "fusion_margin"
            margin = self.target.get(key, 0.0) if isinstance(self.target, dict) else 0.0
            if delta < -0.05 and r.fused and not self.fused:
                why = (f"{-delta:.1f} us faster ({-delta / self.predicted_us:.0%}), less than the {margin:.0%} "
                       "margin fusion needs to be chosen")
            else:
                why = f"{delta:.1f} us slower" if delta > 0.05 else "tied; the enumeration order decides"
            rtop, _ = r._bound()
            out.append(f"Runner-up: {r.summary()} ({why}; bound by {rtop})")
        if self.candidates:
            top_rules = sorted(((v, k) for k, v in self.pruned.items() if v), reverse=True)
            rules = ", ".join(f"{k} {v:,}" for v, k in top_rules)
            out.append(f"Search: {self.candidates:,} candidates, {self.scored:,} scored, in {self.search_ms:.1f} ms; "
                       f"pruned by {rules}")
        return "\n".join(out)

    def to_svg(self):
        """An SVG picture of the plan (text): the cluster's blocks with their roles and tiles, the DSM
        exchanges between them, bytes per memory level and the predicted-time breakdown (see
        :mod:`fuser.svg`). A notebook shows it when a plan is the value of a cell.

        Example:
            >>> import fuser
            >>> p = fuser.plan(16, 4096, 14336, gated=True, activation="silu", fused=True, kind="cluster", target="h200")
            >>> svg = p.to_svg()
            >>> svg.startswith("<svg") and 'data-dataflow="shuffle"' in svg
            True
            >>> 'class="fz-unit"' in fuser.plan(16, 4096, 14336, fused=True, kind="stream", target="h200").to_svg()
            True
        """
        return svg.plan_svg(self)

    def _repr_svg_(self):
        return self.to_svg()


def simulate(plan, x, w_up, w_down, *, w_gate=None, b_up=None, b_gate=None, b_down=None):
    """Run ``plan`` on the CPU plan interpreter: each simulated block uses only its own shared memory and
    reaches peers through explicit DSM copies, accumulating in fp32 and rounding where the kernel does.

    Tensors are CPU tensors in the plan's dtype with the plan's shapes (x: [m, d_model]).
    Returns ``(y, traffic)`` with traffic the bytes counted per level (equal to ``plan.traffic``).

    Example:
        >>> import torch, fuser
        >>> p = fuser.plan(16, 64, 128, activation="relu")
        >>> x, w1, w2 = (torch.randn(*s).bfloat16() for s in [(16, 64), (128, 64), (64, 128)])
        >>> y, traffic = fuser.simulate(p, x, w1, w2)
        >>> traffic == p.traffic
        True
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    c = plan.chain
    dtype = getattr(torch, c["dtype"])
    y = torch.empty(c["m"], c["d_out"], dtype=dtype)

    def view(t):
        return None if t is None else (t.detach() if isinstance(t, torch.Tensor) else t)

    traffic, _barriers, _flops = _C.simulate(plan.core, plan.target or "h200", view(x), view(w_up), view(w_down),
                                             view(w_gate), view(b_up), view(b_gate), view(b_down), y)
    return y, traffic

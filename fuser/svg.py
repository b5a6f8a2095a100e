"""SVG pictures of plans: what ``Plan.to_svg()`` returns and a notebook shows for a ``fuser.Plan``.

A fused plan is drawn as the blocks of one cluster, one box per block, each labelled with its roles as
``include/fuser/plan.h`` defines them (GEMM1 view ``(im, in, ik)``; GEMM2 view: shuffle group ``g``,
position ``s``, output part ``lpart``) and the tiles it holds (token rows, d_ff slice, output part,
reduce-scatter share). The DSM exchanges are drawn between the boxes: an outline around the ``cls_k``
replicas of one ``(im, in)`` (all_exchange), ring arrows among a group's ``cls_shuffle`` blocks
(shuffle), a bus joining the ``cls_reduce`` blocks that share an output part (reduce_scatter); the
inter-cluster reduce is a note with ``grid_n`` and the workspace size. Two bar charts follow: bytes per
memory level and the predicted time by component. An unfused plan gets the charts and a line saying so.

The SVG is written by hand (no plotting library), is deterministic (the same plan gives the same
bytes), parses as XML, and marks what it draws for tools and tests: blocks are ``<g class="fz-block">``
with ``data-rank``, ``data-im``, ... attributes; exchanges carry ``class="fz-xchg"`` and
``data-dataflow``.
"""
from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

__all__ = ["block_roles", "plan_svg"]

#: One colour per dataflow (the legend, the outlines, arrows and buses).
COLORS = {"all_exchange": "#d62728", "shuffle": "#1f77b4", "reduce_scatter": "#2ca02c",
          "inter_cluster_reduce": "#9467bd"}
_FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
_ADVANCE = 0.62     # width of one monospace character, in font sizes (a little over most fonts' 0.6)
_EXTENT = 0.65      # the same for the picture's size: renderers that hint round advances up (7 px at 11 px)
_FS, _LH = 10, 12   # block text: font size and line height
_GAP_X = 30         # between block columns (room for the shuffle arrows)
_PER_LINE = 8       # block columns a line; a 16-wide cluster folds into two lines
_TIME_TERMS = ("launch", "compute", "hbm", "l2", "dsm", "smem", "sync", "tail", "total")


def block_roles(plan):
    """The blocks of one cluster of a fused plan, by rank, with their roles and tiles.

    Computed exactly as ``include/fuser/plan.h`` defines them: rank ``r = ik*(cls_n*cls_m) + in*cls_m + im``;
    GEMM2 view ``g = in // cls_shuffle``, ``s = in % cls_shuffle``, ``lpart = s*cls_k + ik``. Each entry
    is a dict with ``rank, im, in, ik, g, s, lpart``, ``operand`` ("up", "gate", or "gate+up": which
    first-GEMM weights the block multiplies), ``ksplit`` (its K split), and the tiles of cluster (0, 0):
    ``rows`` (token rows), ``d_ff`` (its ``bn * n_iters`` slice), ``out`` (its output part, ``lp``
    columns) and ``share`` (offset and width, ``sw``, of the share of each ``bl``-column output chunk
    it reduces and stores). Cluster ``(cm, cn)`` adds ``cm * cls_m * bm`` to the rows and ``cn * nc``
    to the d_ff columns.

    Example:
        >>> import fuser
        >>> p = fuser.plan(16, 4096, 14336, gated=True, activation="silu", fused=True, cluster=(1, 4, 2, 2),
        ...                target="h200")
        >>> b = fuser.svg.block_roles(p)[5]
        >>> b["rank"], (b["im"], b["in"], b["ik"]), (b["g"], b["s"], b["lpart"]), b["operand"]
        (5, (0, 1, 1), (1, 0, 1), 'up')
    """
    if not plan.fused:
        raise ValueError("plan: an unfused plan has no cluster blocks")
    cls_m, cls_n, cls_k, _ = plan.cluster
    t, d = plan.tiles, plan.derived
    bm, bl = t["bm"], t["bl"]
    cls_shuffle, ksplit, nb, lp, sw = d["cls_shuffle"], d["ksplit"], d["nb"], d["lp"], d["sw"]
    blocks = []
    for rank in range(d["cluster_size"]):
        ik, in_, im = rank // (cls_n * cls_m), rank // cls_m % cls_n, rank % cls_m
        g, s = in_ // cls_shuffle, in_ % cls_shuffle
        lpart = s * cls_k + ik
        operand = {"none": "up", "sequential": "gate+up"}.get(plan.gate_mode) or ("gate" if ik // ksplit == 0 else "up")
        blocks.append(dict(rank=rank, im=im, **{"in": in_}, ik=ik, g=g, s=s, lpart=lpart, operand=operand,
                           ksplit=ik % ksplit, rows=(im * bm, (im + 1) * bm), d_ff=(in_ * nb, (in_ + 1) * nb),
                           out=(lpart * lp, (lpart + 1) * lp), share=(g * sw, sw), chunk=bl))
    return blocks


def _num(v):
    """A coordinate or value, deterministic and short."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


class _Canvas:
    """SVG elements plus the extent they reach (the picture's size follows what was drawn)."""

    def __init__(self):
        self.items, self.right, self.bottom = [], 0.0, 0.0

    def reach(self, x, y):
        self.right, self.bottom = max(self.right, x), max(self.bottom, y)

    def add(self, element):
        self.items.append(element)

    def text(self, x, y, s, size=11, anchor="start", weight=None, fill="#222"):
        width = len(s) * size * _EXTENT
        left = x - (width / 2 if anchor == "middle" else width if anchor == "end" else 0)
        self.reach(left + width, y + size * 0.3)
        extra = (f' text-anchor="{anchor}"' if anchor != "start" else "") + (f' font-weight="{weight}"' if weight else "")
        self.add(f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size}" fill="{fill}"{extra}>{escape(s)}</text>')

    def rect(self, x, y, w, h, fill="none", stroke="none", attrs="", **style):
        self.reach(x + w, y + h)
        more = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in style.items())
        self.add(f'<rect{attrs} x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" fill="{fill}" '
                 f'stroke="{stroke}"{more}/>')

    def svg(self, title, margin=16):
        w, h = int(self.right + margin), int(self.bottom + margin)
        return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" class="fuser-plan" width="{w}" height="{h}" '
                          f'viewBox="0 0 {w} {h}" font-family={quoteattr(_FONT)}>',
                          f"<title>{escape(title)}</title>",
                          f'<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>']
                         + self.items + ["</svg>", ""])


def _arrow(c, pts, head, color, dataflow):
    """An exchange arrow: a path through `pts` (cubic when 4 points) and a filled head at its end."""
    (x0, y0), rest = pts[0], pts[1:]
    d = f"M{_num(x0)},{_num(y0)} " + ("C" if len(rest) == 3 else "L") + " ".join(f"{_num(x)},{_num(y)}" for x, y in rest)
    for x, y in pts:
        c.reach(x, y)
    c.add(f'<g class="fz-xchg" data-dataflow="{dataflow}"><path d="{d}" fill="none" stroke="{color}" '
          f'stroke-width="1.4"/><polygon points="{" ".join(f"{_num(x)},{_num(y)}" for x, y in head)}" '
          f'fill="{color}"/></g>')


def _block_lines(b, plan):
    d, t = plan.derived, plan.tiles
    lines = [f"r{b['rank']}" + ("" if plan.gate_mode == "none" else f" {b['operand']}"),
             f"G1 im{b['im']} in{b['in']} ik{b['ik']}",
             f"G2 g{b['g']} s{b['s']} part{b['lpart']}",
             "rows {}:{}".format(*b["rows"]),
             "d_ff {}:{}".format(*b["d_ff"]) + f" ({t['n_iters']}x{t['bn']})",
             "out {}:{}".format(*b["out"])]
    if d["cls_reduce"] > 1:
        lines.append(f"share {b['share'][1]} @+{b['share'][0]}/{b['chunk']}")
    return lines


def _cluster(c, plan, top):
    """The block grid with its exchanges; returns the y below it.

    Columns are ``in`` (at most eight a line: a 16-wide cluster folds into two lines), rows are ``im``,
    then the ``cls_k`` replicas ``ik`` of each ``(im, in)`` one under the other."""
    cls_m, cls_n, cls_k, _ = plan.cluster
    d = plan.derived
    cs, cr = d["cls_shuffle"], d["cls_reduce"]
    blocks = block_roles(plan)
    labels = {b["rank"]: _block_lines(b, plan) for b in blocks}
    bw = math.ceil(max(len(s) for ls in labels.values() for s in ls) * _FS * _ADVANCE) + 12
    bh = 6 + len(labels[0]) * _LH
    lines = -(-cls_n // _PER_LINE)
    arc = 20 if cs > 1 else 6             # above each row of blocks: the shuffle ring's closing arcs
    bus = 8 + 6 * cs if cr > 1 else 6      # below: the reduce-scatter buses, one per ring position
    joins = 6 + 4 * cs if cr > 1 and lines > 1 else 0   # left: buses joined across lines
    x0 = 72 + joins

    def colx(i):
        return x0 + i % _PER_LINE * (bw + _GAP_X)

    y, row_top = top, {}
    for im in range(cls_m):
        for line in range(lines):
            cols = range(line * _PER_LINE, min(cls_n, (line + 1) * _PER_LINE))
            if im == 0:   # column heads: shuffle groups, then the in index
                for g in sorted({i // cs for i in cols}):
                    xa, xb = colx(max(g * cs, cols[0])), colx(min(g * cs + cs, cols[-1] + 1) - 1) + bw
                    c.text((xa + xb) / 2, y + 10, f"group g{g}" + (f" (shuffle ring of {cs})" if cs > 1 else ""),
                           10, anchor="middle", fill="#555")
                    c.add(f'<path d="M{_num(xa)},{_num(y + 15)} H{_num(xb)}" stroke="#999" fill="none"/>')
                for i in cols:
                    c.text(colx(i) + bw / 2, y + 28, f"in {i}", 10, anchor="middle", fill="#555")
                y += 34
            for ik in range(cls_k):
                row_top[im, line, ik] = y + arc
                c.text(x0 - joins - 12, y + arc + bh / 2 + 3, f"im{im} ik{ik}", 10, anchor="end", fill="#555")
                y += arc + bh + bus
            y += 10

    def box(im, i, ik):
        return colx(i), row_top[im, i // _PER_LINE, ik]

    # all_exchange: an outline around the cls_k replicas of each (im, in)
    if cls_k > 1:
        for im in range(cls_m):
            for i in range(cls_n):
                x, y0 = box(im, i, 0)
                y1 = box(im, i, cls_k - 1)[1] + bh
                c.rect(x - 5, y0 - 4, bw + 10, y1 - y0 + 8, stroke=COLORS["all_exchange"], rx=6,
                       stroke_width=1.6, stroke_dasharray="5,3",
                       attrs=f' class="fz-xchg" data-dataflow="all_exchange" data-im="{im}" data-in="{i}"')
    # the blocks
    for b in blocks:
        x, yb = box(b["im"], b["in"], b["ik"])
        fill = {"gate": "#fff3e0", "up": "#eef5fc", "gate+up": "#f4f0fa"}[b["operand"]]
        attrs = "".join(f' data-{k}="{b[k]}"' for k in ("rank", "im", "in", "ik", "g", "s", "lpart"))
        c.add(f'<g class="fz-block"{attrs}>')
        c.rect(x, yb, bw, bh, fill=fill, stroke="#444", rx=3)
        for n, line in enumerate(labels[b["rank"]]):
            c.text(x + 6, yb + 4 + (n + 1) * _LH - 2, line, _FS, weight="bold" if n == 0 else None)
        c.add("</g>")
    # shuffle: each block reads its ring neighbours' H slices, starting with position s + 1
    if cs > 1:
        color = COLORS["shuffle"]
        for im in range(cls_m):
            for ik in range(cls_k):
                for g in range(cr):
                    for s in range(cs):
                        src, dst = g * cs + (s + 1) % cs, g * cs + s
                        (xs, ys), (xd, yd) = box(im, src, ik), box(im, dst, ik)
                        if src == dst + 1 and ys == yd:   # neighbours: right to left, in the gap
                            ya, xa, xb = yd + bh / 2, xs - 2, xd + bw + 2
                            _arrow(c, [(xa, ya), (xb, ya)], [(xb, ya), (xb + 7, ya - 3.5), (xb + 7, ya + 3.5)],
                                   color, "shuffle")
                        elif ys == yd:   # the ring closes over the top of its line
                            xa, xb = xs + bw / 2 + 8, xd + bw / 2 - 8
                            _arrow(c, [(xa, ys), (xa, ys - arc + 3), (xb, ys - arc + 3), (xb, yd)],
                                   [(xb, yd), (xb - 3.5, yd - 7), (xb + 3.5, yd - 7)], color, "shuffle")
                        elif ys > yd:    # up to the end of the line above
                            xa, xb = xs + bw / 2 - 8, xd + bw / 2 + 8
                            _arrow(c, [(xa, ys), (xa, ys - 30), (xb, yd + bh + 30), (xb, yd + bh)],
                                   [(xb, yd + bh), (xb - 3.5, yd + bh + 7), (xb + 3.5, yd + bh + 7)], color,
                                   "shuffle")
                        else:            # down to the end of the line below
                            xa, xb = xs + bw / 2 + 8, xd + bw / 2 - 8
                            _arrow(c, [(xa, ys + bh), (xa, ys + bh + 30), (xb, yd - 30), (xb, yd)],
                                   [(xb, yd), (xb - 3.5, yd - 7), (xb + 3.5, yd - 7)], color, "shuffle")
    # reduce_scatter: a bus joining the cls_reduce blocks of each output part (same im, ik, s)
    if cr > 1:
        color = COLORS["reduce_scatter"]
        for im in range(cls_m):
            for ik in range(cls_k):
                for s in range(cs):
                    members = [box(im, g * cs + s, ik) for g in range(cr)]
                    xs = [x + bw / 2 + 4 * s for x, _ in members]
                    ybus = {yb: yb + bh + 6 + 6 * s for _, yb in members}
                    d_ = [f"M{_num(x)},{_num(yb + bh)} V{_num(ybus[yb])}" for x, (_, yb) in zip(xs, members)]
                    for yb, yy in ybus.items():   # one bus per line, joined in the left margin
                        here = [x for x, (_, y_) in zip(xs, members) if y_ == yb]
                        left = x0 - 6 - 4 * s if len(ybus) > 1 else min(here)
                        d_.append(f"M{_num(left)},{_num(yy)} H{_num(max(here))}")
                    if len(ybus) > 1:
                        d_.append(f"M{_num(x0 - 6 - 4 * s)},{_num(min(ybus.values()))} V{_num(max(ybus.values()))}")
                    c.reach(max(xs), max(ybus.values()))
                    c.add(f'<g class="fz-xchg" data-dataflow="reduce_scatter" data-im="{im}" data-ik="{ik}" '
                          f'data-s="{s}"><path d="{" ".join(d_)}" fill="none" stroke="{color}" stroke-width="1.6"/>'
                          + "".join(f'<circle cx="{_num(x)}" cy="{_num(ybus[yb])}" r="2.2" fill="{color}"/>'
                                    for x, (_, yb) in zip(xs, members))
                          + "</g>")
    return y


def _bars(c, x, y, title, rows, fmt, highlight=None, width=250):
    """A horizontal bar chart: rows of (label, value); returns the x right of it and the y below it."""
    c.text(x, y, title, 11, weight="bold")
    top = max((v for _, v in rows), default=0) or 1.0
    label_w = max(len(k) for k, _ in rows) * 10 * _ADVANCE + 8
    right = x + max(len(title) * 11 * _ADVANCE, label_w + width + 6 + max(len(fmt(v)) + 9 for _, v in rows) * 10 * _ADVANCE)
    for i, (k, v) in enumerate(rows):
        yy = y + 8 + i * 16
        c.add(f'<g class="fz-bar" data-key={quoteattr(k)} data-value="{v!r}">')
        c.text(x, yy + 10, k, 10, fill="#444")
        color = "#e6550d" if k == highlight else "#6baed6" if k != "total" else "#555"
        c.rect(x + label_w, yy + 1, max(width * v / top, 0.5), 11, fill=color)
        c.text(x + label_w + width + 6, yy + 10, fmt(v) + ("  <- bound" if k == highlight else ""), 10)
        c.add("</g>")
    return right, y + 8 + len(rows) * 16


def _charts(c, plan, y):
    tr, b = plan.traffic, plan.breakdown
    x1, y1 = _bars(c, 16, y, "bytes per memory level", [(k, float(tr[k])) for k in ("hbm", "l2", "dsm", "smem")],
                   lambda v: f"{v / 1e6:,.1f} MB ({int(v):,} B)")
    bound, _ = plan._bound()
    x2 = x1 + 24
    _, y2 = _bars(c, x2, y, "predicted time, us", [(k, float(b[k])) for k in _TIME_TERMS], lambda v: f"{v:,.1f} us",
               highlight=bound)
    c.text(x2, y2 + 14, "total = launch + max(compute, hbm, l2, dsm, smem) + sync + tail" if plan.fused else
           "total = launch + compute + hbm (one kernel after another)", 10, fill="#555")
    if plan.floor_us:
        c.text(x2, y2 + 28, f"roofline floor {plan.floor_us:,.1f} us: predicted "
                            f"{b['total'] / plan.floor_us:.2f}x the floor", 10, fill="#555")
    return max(y1, y2 + 28)


def _stream_svg(c, plan):
    """A stream plan: its two phases as rows of unit boxes (n-tiles x K splits, then l-tiles x d_ff splits),
    H between them in L2, and the charts."""
    d, p = plan.derived, plan.raw["params"]
    s1, s2 = plan.splits
    c.text(16, 58, f"stream: one persistent launch, {d['units']} work units claimed in order by the blocks; "
                   f"bm={p['bm']} token rows, {p['stages']} pipeline stages", 11, fill="#444")
    y = 72
    for phase, tiles, width, splits, what in ((1, d["nt1"], p["bn"], s1, "d_ff columns, K split"),
                                              (2, d["lt2"], p["bl"], s2, "output columns, d_ff split")):
        shown = min(tiles, 16)
        c.text(16, y + 12, f"phase {phase}: {tiles} tiles of {width} {what} x {splits}", 11, weight="bold")
        y += 18
        for i in range(shown):
            for k in range(min(splits, 4)):
                c.rect(16 + i * 46, y + k * 14, 42, 12, fill=COLORS["shuffle" if phase == 1 else "reduce_scatter"],
                       attrs=f' class="fz-unit" data-phase="{phase}" data-tile="{i}" data-split="{k}"')
        if tiles > shown:
            c.text(16 + shown * 46, y + 10, f"... {tiles - shown} more", 11, fill="#444")
        y += min(splits, 4) * 14 + 6
        if phase == 1:
            c.text(16, y + 12, f"H [{plan.chain['m']} x {plan.chain['d_ff']}] in 16 bits through L2; phase-2 units "
                               "wait on the ready count of their d_ff range", 11, fill="#444")
            y += 22
    _charts(c, plan, y + 14)
    return c.svg(plan.summary())


def plan_svg(plan):
    """The SVG text picturing ``plan`` (a :class:`fuser.Plan`): the cluster's blocks and their DSM
    exchanges for a fused plan, bytes per memory level and the predicted-time breakdown for any plan.
    ``Plan.to_svg()`` and a notebook's rich display call it.

    Example:
        >>> import xml.etree.ElementTree as ET, fuser
        >>> p = fuser.plan(16, 4096, 14336, gated=True, activation="silu", fused=True, cluster=(1, 16, 1, 16),
        ...                target="h200")
        >>> root = ET.fromstring(fuser.svg.plan_svg(p))
        >>> sum(e.get("class") == "fz-block" for e in root.iter()), sum(e.get("data-dataflow") == "shuffle" for e in root.iter())
        (16, 16)
    """
    if not callable(getattr(plan, "describe_dataflows", None)):
        raise TypeError(f"plan: expected a fuser.Plan, got {type(plan).__name__}")
    c = _Canvas()
    c.text(16, 22, "fuser plan: " + plan.summary(), 13, weight="bold")
    c.text(16, 40, f"FFN: {plan.describe_chain()}; target {plan.target.get('name', '?')}", 11, fill="#444")
    if not plan.fused:
        c.text(16, 62, "unfused: PyTorch eager ops (library GEMMs, the intermediate through HBM); "
                       "no cluster, no DSM exchange", 11)
        _charts(c, plan, 86)
        return c.svg(plan.summary())
    d, t = plan.derived, plan.tiles
    if plan.kind == "stream":
        return _stream_svg(c, plan)
    c.text(16, 58, f"cluster (cls_m, cls_n, cls_k, cls_l) = {plan.cluster}: {d['cluster_size']} blocks, "
                   f"cls_shuffle {d['cls_shuffle']}, cls_reduce {d['cls_reduce']}; grid {d['grid_m']} x "
                   f"{d['grid_n']} clusters (tokens x d_ff) = {d['blocks']} blocks", 11, fill="#444")
    c.text(16, 74, f"tiles bm={t['bm']} bn={t['bn']}x{t['n_iters']} bl={t['bl']} (lp={d['lp']}, sw={d['sw']}); "
                   f"labels show cluster (0, 0): cluster (cm, cn) adds cm*{plan.cluster[0] * t['bm']} to rows and "
                   f"cn*{d['nc']} to d_ff", 11, fill="#444")
    y = _cluster(c, plan, 84) + 8
    for df, line in plan.describe_dataflows():
        if df == "local":
            c.text(16, y + 9, line, 11)
            y += 17
            continue
        if df == "inter_cluster_reduce":
            c.add(f'<g class="fz-xchg" data-dataflow="inter_cluster_reduce" data-grid-n="{d["grid_n"]}" '
                  f'data-workspace-bytes="{d["workspace_bytes"]}">')
        c.rect(16, y, 14, 10, fill=COLORS[df])
        c.text(36, y + 9, line, 11)
        if df == "reduce_scatter":
            c.text(36, y + 24, f"'share W @+O/{t['bl']}' in a block: the W columns at offset O of each {t['bl']}-column "
                               f"output chunk that it reduces and stores", 11, fill="#444")
            y += 15
        if df == "inter_cluster_reduce":
            c.text(36, y + 24, f"grid_n = {d['grid_n']}; workspace {d['workspace_bytes']:,} B of fp32 partials "
                               f"in global memory, {d['tickets']:,} tickets", 11, fill="#444")
            c.add("</g>")
            y += 15
        y += 17
    _charts(c, plan, y + 14)
    return c.svg(plan.summary())

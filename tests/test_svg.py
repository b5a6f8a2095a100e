"""Plan pictures (``Plan.to_svg()``, ``_repr_svg_``, ``fuser.svg``): the SVG parses as XML, has one box
per cluster block labelled with the roles plan.h defines (recomputed here from the rank), draws the
right number of exchanges for each dataflow, notes the inter-cluster reduce with its workspace, charts
the plan's own bytes and predicted times, escapes its text, is deterministic, and says so for an
unfused plan."""
import collections
import re
import xml.etree.ElementTree as ET

import pytest

import fuser
from fuser import svg

NS = "{http://www.w3.org/2000/svg}"
LLAMA3 = dict(d_model=4096, d_ff=14336, gated=True, activation="silu", target="h200")


def forced(m, cluster, **kw):
    return fuser.plan(m, **{**LLAMA3, **kw}, fused=True, cluster=cluster, kind="cluster")


def parse(p):
    text = p.to_svg()
    root = ET.fromstring(text)   # raises on invalid XML
    assert root.tag == NS + "svg"
    return root


def exchanges(root):
    return collections.Counter(e.get("data-dataflow") for e in root.iter() if e.get("class") == "fz-xchg")


def block_text(block):
    return [t.text for t in block.iter(NS + "text")]


CASES = [(16, (1, 4, 2, 2)), (16, (1, 16, 1, 16)), (64, (2, 2, 2, 2)), (16, (1, 1, 1, 1)), (16, (1, 8, 2, 4)),
         (64, (1, 16, 1, 4)), (64, (2, 4, 1, 2))]


@pytest.mark.parametrize("m,cluster", CASES)
def test_blocks_and_exchanges(m, cluster):
    p = forced(m, cluster)
    assert p.cluster == cluster
    cls_m, cls_n, cls_k, cls_l = cluster
    d, t = p.derived, p.tiles
    cls_shuffle, cls_reduce = cls_l // cls_k, cls_n * cls_k // cls_l
    assert (d["cls_shuffle"], d["cls_reduce"]) == (cls_shuffle, cls_reduce)
    root = parse(p)

    blocks = [e for e in root.iter() if e.get("class") == "fz-block"]
    assert len(blocks) == cls_m * cls_n * cls_k
    for b in blocks:
        r = int(b.get("data-rank"))
        ik, in_, im = r // (cls_n * cls_m), r // cls_m % cls_n, r % cls_m   # plan.h
        g, s = in_ // cls_shuffle, in_ % cls_shuffle
        want = dict(im=im, ik=ik, g=g, s=s, lpart=s * cls_k + ik, **{"in": in_})
        assert {k: int(b.get("data-" + k)) for k in want} == want
        text = block_text(b)
        assert text[0].startswith(f"r{r}")
        assert f"G1 im{im} in{in_} ik{ik}" in text and f"G2 g{g} s{s} part{s * cls_k + ik}" in text
        nb = t["bn"] * t["n_iters"]
        assert f"rows {im * t['bm']}:{(im + 1) * t['bm']}" in text
        assert f"d_ff {in_ * nb}:{(in_ + 1) * nb} ({t['n_iters']}x{t['bn']})" in text
        assert f"out {(s * cls_k + ik) * d['lp']}:{(s * cls_k + ik + 1) * d['lp']}" in text
        if cls_reduce > 1:
            assert f"share {d['sw']} @+{g * d['sw']}/{t['bl']}" in text
    assert sorted(int(b.get("data-rank")) for b in blocks) == list(range(len(blocks)))

    want = collections.Counter()
    if cls_k > 1:
        want["all_exchange"] = cls_m * cls_n              # one outline per (im, in): its cls_k replicas
    if cls_shuffle > 1:
        want["shuffle"] = cls_m * cls_n * cls_k           # one ring arrow into every block
    if cls_reduce > 1:
        want["reduce_scatter"] = cls_m * cls_k * cls_shuffle   # one bus per output part
    if d["grid_n"] > 1:
        want["inter_cluster_reduce"] = 1
    assert exchanges(root) == want
    assert set(want) == set(p.dataflows)
    # ring neighbours on one line of boxes (at most 8 columns a line) get a straight arrow; the arrow that
    # closes a ring, or crosses to another line, is a curve
    straight = sum((g * cls_shuffle + s + 1) // 8 == (g * cls_shuffle + s) // 8
                   for g in range(cls_reduce) for s in range(cls_shuffle - 1)) * cls_m * cls_k
    paths = [e.find(NS + "path").get("d") for e in root.iter()
             if e.get("class") == "fz-xchg" and e.get("data-dataflow") == "shuffle"]
    assert sum(" L" in d for d in paths) == straight and sum(" C" in d for d in paths) == len(paths) - straight


def test_inter_cluster_note_and_title():
    p = forced(16, (1, 16, 1, 16))
    root = parse(p)
    note = next(e for e in root.iter() if e.get("data-dataflow") == "inter_cluster_reduce")
    d = p.derived
    assert int(note.get("data-grid-n")) == d["grid_n"] > 1
    assert int(note.get("data-workspace-bytes")) == d["workspace_bytes"] > 0
    assert any(f"grid_n = {d['grid_n']}; workspace {d['workspace_bytes']:,} B" in (t.text or "")
               for t in note.iter(NS + "text"))
    assert root.find(NS + "title").text == p.summary()


def test_no_exchange_says_so():
    p = fuser.plan(128, 256, 512, activation="relu", fused=True, cluster=(1, 1, 1, 1), bn=128, n_iters=4,
                   target="h200")
    assert p.dataflows == () and p.derived["grid_n"] == 1
    root = parse(p)
    assert exchanges(root) == {}
    assert any("no inter-block exchange" in (t.text or "") for t in root.iter(NS + "text"))


@pytest.mark.parametrize("fused", [True, False])
def test_charts_show_the_plans_numbers(fused):
    p = fuser.plan(128, **LLAMA3, fused=fused)
    bars = [e for e in parse(p).iter() if e.get("class") == "fz-bar"]
    keys = [e.get("data-key") for e in bars]
    values = [float(e.get("data-value")) for e in bars]
    assert keys == ["hbm", "l2", "dsm", "smem", "launch", "compute", "hbm", "l2", "dsm", "smem", "sync", "tail",
                    "total"]
    assert values[:4] == [float(p.traffic[k]) for k in keys[:4]]           # bytes per level
    assert values[4:] == [float(p.breakdown[k]) for k in keys[4:]]         # predicted time by component
    bound = p._bound()[0]
    marked = [e.get("data-key") for e in bars[4:] if any("<- bound" in (t.text or "") for t in e.iter(NS + "text"))]
    assert marked == [bound]


def test_unfused_plan():
    p = fuser.plan(128, fused=False, **LLAMA3)
    assert not p.fused
    root = parse(p)
    texts = [t.text for t in root.iter(NS + "text")]
    assert not [e for e in root.iter() if e.get("class") in ("fz-block", "fz-xchg")]
    assert any(t.startswith("unfused: PyTorch eager ops") for t in texts)
    assert any(f"{p.predicted_us:,.1f} us" in t for t in texts)
    # its kernels run one after another: the chart's formula adds the terms, a fused plan's takes their maximum
    assert "total = launch + compute + hbm (one kernel after another)" in texts
    assert not any(t.startswith("total = launch + max(") for t in texts)
    fused = [t.text for t in parse(fuser.plan(128, fused=True, **LLAMA3)).iter(NS + "text")]
    assert "total = launch + max(compute, hbm, l2, dsm, smem) + sync + tail" in fused
    with pytest.raises(ValueError, match="unfused"):
        svg.block_roles(p)


def test_deterministic_and_rich_display():
    a, b = forced(16, (1, 8, 2, 4)), forced(16, (1, 8, 2, 4))
    assert a.to_svg() == b.to_svg() == a._repr_svg_()
    assert a.to_svg() == fuser.Plan.from_dict(a.to_dict()).to_svg()
    w, h = (int(parse(a).get(k)) for k in ("width", "height"))
    assert parse(a).get("viewBox") == f"0 0 {w} {h}"


def test_text_is_escaped(monkeypatch):
    p = forced(16, (1, 4, 2, 2))
    monkeypatch.setattr(p, "summary", lambda: 'a <b> & "c"')
    root = parse(p)
    assert root.find(NS + "title").text == 'a <b> & "c"'
    assert re.search(r"&lt;b&gt; &amp;", p.to_svg())


def test_rejects_non_plans():
    with pytest.raises(TypeError, match="fuser.Plan"):
        svg.plan_svg("not a plan")

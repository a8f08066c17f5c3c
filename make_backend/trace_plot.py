"""`gxpc plot TRACE -o out.png`: a `gxpc make --trace` file drawn as Confuga's
figures: transfer density (a row per node, a bar per transfer over time, push
and pull in two colours, recipes thin underneath) and cumulative bytes
delivered over time.

matplotlib is an optional extra (`pip install 'gxpstyle[plot]'`): the core
keeps its dependencies, and without it this says so in one line.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

INSTALL_HINT = "plotting needs matplotlib: pip install 'gxpstyle[plot]' (or pip install matplotlib)"


class PlotError(Exception):
    """A one-line reason for the user."""


def read_trace(path: str) -> List[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PlotError("cannot read %s: %s" % (path, e.strerror))
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if rec.get("kind") not in ("recipe", "transfer"):
                raise ValueError
            float(rec["start"]), float(rec["end"]), str(rec["node"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PlotError("%s:%d: not a line of gxpc make --trace" % (path, n))
        out.append(rec)
    if not out:
        raise PlotError("%s: no recipe or transfer in it" % path)
    return out


def cumulative(recs: List[Dict[str, Any]], t0: float) -> Tuple[List[float], List[float]]:
    """(seconds, MB delivered by then), a step at each transfer's end."""
    xs, ys, total = [0.0], [0.0], 0.0
    for r in sorted((r for r in recs if r["kind"] == "transfer"), key=lambda r: r["end"]):
        total += int(r.get("bytes") or 0) / 1e6
        xs.append(float(r["end"]) - t0)
        ys.append(total)
    return xs, ys


def plot(trace: str, out: str) -> None:
    recs = read_trace(trace)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(INSTALL_HINT)
    t0 = min(float(r["start"]) for r in recs)
    nodes = sorted({str(r["node"]) for r in recs})
    row = {n: i for i, n in enumerate(nodes)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 2 + 0.35 * len(nodes) + 3),
                                      gridspec_kw={"height_ratios": [max(2, len(nodes)), 4]})
    colours = {"push": "tab:blue", "pull": "tab:orange"}
    for r in recs:
        y, s, e = row[str(r["node"])], float(r["start"]) - t0, float(r["end"]) - t0
        if r["kind"] == "recipe":
            top.broken_barh([(s, max(e - s, 1e-3))], (y - 0.4, 0.15), color="0.6")
        else:
            top.broken_barh([(s, max(e - s, 1e-3))], (y - 0.2, 0.55), alpha=0.45,
                            color=colours.get(str(r.get("mode")), "tab:green"))
    top.set_yticks(range(len(nodes)))
    top.set_yticklabels(nodes)
    top.set_ylim(-0.6, len(nodes) - 0.4)
    top.set_xlabel("seconds")
    top.set_title("transfers per node (blue: push, orange: pull; grey: recipes)")
    xs, ys = cumulative(recs, t0)
    bottom.step(xs, ys, where="post")
    bottom.set_xlim(top.get_xlim())
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("MB delivered")
    bottom.set_title("cumulative bytes transferred")
    fig.tight_layout()
    try:
        fig.savefig(out)
    except (OSError, ValueError) as e:
        raise PlotError("cannot write %s: %s" % (out, getattr(e, "strerror", None) or e))
    finally:
        plt.close(fig)

"""`gxpc plot TRACE -o out.png`: a `gxpc make --trace` file drawn as Confuga's
figures: transfer density (a row per node, a bar per transfer over time, push
and pull in two colours, recipes thin underneath) and cumulative bytes
delivered over time.

matplotlib is an optional extra (`pip install 'gxpstyle[plot]'`): the core
keeps its dependencies, and without it this says so in one line.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from gxpstyle.config import safe_paths

INSTALL_HINT = "plotting needs matplotlib: pip install 'gxpstyle[plot]' (or pip install matplotlib)"
# What plot reads and draws, at most: a trace of 16 MiB is a run of some
# 100,000 recipes and transfers (drawn in about 6 s and 200 MB); no
# line of gxpc make --trace nears 64 KiB; past 256 rows a figure is no
# longer readable.
MAX_TRACE_BYTES = 16 << 20
MAX_LINE_BYTES = 64 << 10
MAX_NODES = 256
FORMATS = (".png", ".svg", ".pdf")


class PlotError(Exception):
    """A one-line reason for the user: a bad trace or image name (exit 2)."""


class PlotFailed(PlotError):
    """The trace could not be read, the image written, or matplotlib is missing (exit 1)."""


def check_output(path: str) -> str:
    """The image's format from its name (png, svg or pdf); a name without one
    of these, or a target that is not a regular file, is refused."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise PlotError("-o %s: name the image with .png, .svg or .pdf (the format follows "
                        "the name)" % path)
    why = safe_paths.replace_problem(path)
    if why:
        raise PlotError("-o %s: %s" % (path, why))
    return ext[1:]


# One bar: (what, node, start, end, bytes); what is "recipe", or a transfer's mode.
Bar = Tuple[str, str, float, float, int]


def _record(path: str, n: int, raw: bytes) -> Optional[Bar]:
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL")
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlotError("%s:%d: not text (not a gxpc make --trace file)" % (path, n)) from None
    try:
        rec = json.loads(line)
        if rec.get("kind") in ("pool", "wan"):
            return None          # an elastic pool's change, the WAN's bytes: not bars
        if rec.get("kind") not in ("recipe", "transfer"):
            raise ValueError
        start, end, node = float(rec["start"]), float(rec["end"]), str(rec["node"])
        if not (math.isfinite(start) and math.isfinite(end)) or len(node) > 1024:
            raise ValueError
        what = "recipe" if rec["kind"] == "recipe" else str(rec.get("mode"))[:16]
        return (what, node, start, end, int(rec.get("bytes") or 0))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        raise PlotError("%s:%d: not a line of gxpc make --trace" % (path, n)) from None


def read_trace(path: str) -> List[Bar]:
    """The trace's records, read line by line (at most MAX_TRACE_BYTES in all,
    MAX_LINE_BYTES a line, MAX_NODES nodes)."""
    try:
        f = safe_paths.open_input(path, MAX_TRACE_BYTES)
    except safe_paths.PathRefused as e:
        raise PlotError("cannot read %s" % e) from None
    except (FileNotFoundError, NotADirectoryError, PermissionError) as e:
        raise PlotError("cannot read %s: %s" % (path, e.strerror)) from None
    except OSError as e:
        raise PlotFailed("cannot read %s: %s" % (path, e.strerror)) from None
    out: List[Bar] = []
    nodes = set()
    with f:
        n = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise PlotFailed("cannot read %s: %s" % (path, e.strerror)) from None
            if not raw:
                break
            n += 1
            if len(raw) > MAX_LINE_BYTES:
                raise PlotError("%s:%d: a line over %s: not a gxpc make --trace file"
                                % (path, n, safe_paths.size_words(MAX_LINE_BYTES)))
            if not raw.strip():
                continue
            rec = _record(path, n, raw)
            if rec is None:
                continue
            nodes.add(rec[1])
            if len(nodes) > MAX_NODES:
                raise PlotError("%s: more than %d nodes; plot draws a row per node, %d at most"
                                % (path, MAX_NODES, MAX_NODES))
            out.append(rec)
    if not out:
        raise PlotError("%s: no recipe or transfer in it" % path)
    return out


def cumulative(recs: List[Bar], t0: float) -> Tuple[List[float], List[float]]:
    """(seconds, MB delivered by then), a step at each transfer's end."""
    xs, ys, total = [0.0], [0.0], 0.0
    for _, _, _, end, nbytes in sorted((r for r in recs if r[0] != "recipe"), key=lambda r: r[3]):
        total += nbytes / 1e6
        xs.append(end - t0)
        ys.append(total)
    return xs, ys


def plot(trace: str, out: str) -> None:
    fmt = check_output(out)
    recs = read_trace(trace)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotFailed(INSTALL_HINT)
    t0 = min(r[2] for r in recs)
    nodes = sorted({r[1] for r in recs})
    row = {n: i for i, n in enumerate(nodes)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 2 + 0.35 * len(nodes) + 3),
                                      gridspec_kw={"height_ratios": [max(2, len(nodes)), 4]})
    colours = {"push": "tab:blue", "pull": "tab:orange"}
    # one call per row and kind: an artist per bar would not end for long traces
    bars: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for kind, node, start, end, _ in recs:
        bars.setdefault((node, kind), []).append((start - t0, max(end - start, 1e-3)))
    for (node, kind), spans in bars.items():
        y = row[node]
        if kind == "recipe":
            top.broken_barh(spans, (y - 0.4, 0.15), color="0.6")
        else:
            top.broken_barh(spans, (y - 0.2, 0.55), alpha=0.45, color=colours.get(kind, "tab:green"))
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
        _save(fig, out, fmt)
    finally:
        plt.close(fig)


def _save(fig: Any, out: str, fmt: str) -> None:
    """Written as a regular file only (the user's umask); a failed write leaves
    no partial image."""
    existed = os.path.exists(out)
    try:
        with safe_paths.open_output(out, binary=True) as f:
            fig.savefig(f, format=fmt)
    except safe_paths.PathRefused as e:
        raise PlotError("cannot write %s" % e) from None
    except (OSError, ValueError) as e:
        if not existed:
            try:
                os.unlink(out)
            except OSError:
                pass
        raise PlotFailed("cannot write %s: %s" % (out, getattr(e, "strerror", None) or e)) from None

"""gxpc's `make` verb, registered through the `gxpstyle.verbs` entry points.

make's arguments are never gxpc's to parse: the verb is raw and gets every word
after `make` untouched (make_command.py splits off its own --local and --help).
"""
from __future__ import annotations

from gxpstyle.gxpc.verbs import EXIT_FAILED, EXIT_USAGE, OPTIONAL, Arg, Opt, Verb, err

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from gxpstyle.gxpc.client import Client


def cmd_make(c: Optional[Client], a: Any) -> int:
    from make_backend.command import make_command
    try:
        return make_command.main(c, c.session_dir if c else "", a.words)
    except make_command.MakeUsage as e:
        err("make: %s" % e)
        return EXIT_USAGE


MAKE = Verb("make", "GNU make with every recipe on a node the head picks", cmd_make,
            session=OPTIONAL, raw=True,
            description="gxpc make [--local] [MAKE-ARGUMENTS...]: see gxpc make --help")


def cmd_plot(c: Optional[Client], a: Any) -> int:
    from make_backend.command import trace_plot
    try:
        trace_plot.plot(a.trace, a.output)
    except trace_plot.PlotError as e:
        err("plot: %s" % e)
        return EXIT_FAILED if isinstance(e, trace_plot.PlotFailed) else EXIT_USAGE
    return 0


PLOT = Verb("plot", "draw a gxpc make --trace file: transfers and bytes over time", cmd_plot,
            options=[Opt(["-o", "--output"], help="the image to write: a name ending in .png, .svg "
                         "or .pdf (a regular file, made or replaced)",
                         metavar="FILE")],
            args=[Arg("trace", help="the trace (gxpc make --trace=FILE)", metavar="TRACE")],
            session=OPTIONAL, check=lambda a: _check_plot(a),
            description="gxpc plot TRACE -o OUT.png: a row per node with its transfers (push, pull) "
                        "and recipes over time, and the cumulative bytes transferred. TRACE is "
                        "read line by line: at most 16 MiB, 64 KiB a line, 256 nodes. Needs "
                        "matplotlib (pip install 'gxpstyle[plot]').")


def _check_plot(a: Any) -> None:
    from gxpstyle.gxpc.verbs import UsageError
    if not a.output:
        raise UsageError("plot: give the image to write with -o FILE")
    from make_backend.command import trace_plot
    try:
        trace_plot.check_output(a.output)
    except trace_plot.PlotError as e:
        raise UsageError("plot: %s" % e) from None

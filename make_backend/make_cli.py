"""gxpc's `make` verb, registered through the `gxpstyle.verbs` entry points.

make's arguments are never gxpc's to parse: the verb is raw and gets every word
after `make` untouched (make_command.py splits off its own --local and --help).
"""
from __future__ import annotations

from gxpstyle.verbs import EXIT_USAGE, OPTIONAL, Verb, err

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from gxpstyle.client import Client


def cmd_make(c: Optional[Client], a: Any) -> int:
    from make_backend import make_command
    try:
        return make_command.main(c, c.session_dir if c else "", a.words)
    except make_command.MakeUsage as e:
        err("make: %s" % e)
        return EXIT_USAGE


MAKE = Verb("make", "GNU make with every recipe on a node the head picks", cmd_make,
            session=OPTIONAL, raw=True,
            description="gxpc make [--local] [MAKE-ARGUMENTS...]: see gxpc make --help")

"""real_project.py's report: each step's medians and ratios, the CPU by
process, the goals of issue 26 and the ceilings beside them."""
from __future__ import annotations

import os

from bench_harness import holds_text, ratio_text

STEPS = ("unpack", "configure", "build", "check")
CASES = ("local", "bindfs", "shared", "gmount", "nodebindfs", "nodesshfsm")
# the cases with a mount over the shared directory on every node: its command
NODE_MOUNTS = {"nodebindfs": "bindfs --no-allow-other %s %s", "nodesshfsm": "/usr/bin/python3 -I %s %s %s"}
ON_HOSTS = ("shared", "gmount") + tuple(NODE_MOUNTS)  # cases whose build and check run on the hosts
PROJECTS = {"hello": "GNU hello", "patch": "GNU patch", "sed": "GNU sed"}
GOAL_UNPACK_X_BINDFS, GOAL_X_LOCAL, GOAL_HOSTS = 2.0, 1.5, 4
# the ratios printed: what the FUSE ceiling costs, what the GMount costs against
# local disk, bindfs, and the same distribution of recipes with no mount
RATIOS = (("bindfs", "local"), ("shared", "local"), ("gmount", "local"), ("gmount", "bindfs"),
          ("gmount", "shared"))


class ProjectReport:
    """The report of a RealProject run (a mixin: the samples, results and
    options are the run's)."""

    def report(self) -> None:
        cases = [c for c in CASES if c in self.a.cases]
        print("%s (%s), `make -j%d`, median of %d reps; seconds per step; load average before each case: %s"
              % (PROJECTS.get(self.a.project, self.a.project), os.path.basename(self.tarball), self.a.jobs,
                 self.a.reps, ", ".join("%s %s" % (c, self.info.get("load " + c, "-")) for c in cases)))
        print("%-10s" % "step" + "".join("%12s" % c for c in cases)
              + "".join("%15s" % ("%s/%s" % r) for r in RATIOS))
        for step in STEPS[:STEPS.index(self.a.upto) + 1]:
            v = {c: self.med("%s %s" % (c, step)) for c in cases}
            row = "%-10s" % step + "".join("%12s" % self._cell(c, step) for c in cases)
            for num, den in RATIOS:
                row += "%15s" % ratio_text(v.get(den), v.get(num))
            print(row)
        print()
        for c in cases:
            if "%s tests TOTAL" % c in self.info:
                counts = [self.info["%s tests %s" % (c, w)] for w in ("TOTAL", "PASS", "SKIP", "FAIL")]
                print("make check in %s: %d tests, %d passed, %d skipped, %d failed" % tuple([c] + counts))
        for case in ON_HOSTS:
            for step in ("build", "check"):
                by_host = self.info.get("%s %s compiles" % (case, step))
                if by_host:
                    print("gxpc make %s (%s): %d compiles on %d hosts (%s)" % (
                        step, case, sum(by_host.values()), len(by_host),
                        ", ".join("%s %d" % kv for kv in sorted(by_host.items()))))
        self._cpu_lines(cases)
        self._goals(cases)
        for line in self.noticed_lines():
            print(line)

    def _cpu_lines(self, cases: list) -> None:
        """The machine's CPU seconds of each step (median), and the session's by
        kind of process (the mean of the runs' sums)."""
        print()
        for step in STEPS[1:STEPS.index(self.a.upto) + 1]:
            cells = []
            for c in cases:
                v = self.med("%s %s cpu s" % (c, step))
                if v is None:
                    continue
                prefix, runs = "%s %s session by " % (c, step), len(self.samples["%s %s" % (c, step)])
                kinds = sorted((k[len(prefix):], sum(v) / runs) for k, v in self.samples.items()
                               if k.startswith(prefix))
                shown = ", ".join("%s %.2f" % kv for kv in kinds if kv[1] >= 0.05)
                cells.append("%s %.2f%s" % (c, v, " (%s)" % shown if shown else ""))
            if cells:
                print("CPU seconds of %s (the machine; of it the session's, by process): %s"
                      % (step, "; ".join(cells)))

    def _cell(self, case: str, step: str) -> str:
        v = self.med("%s %s" % (case, step))
        if v is not None:
            return "%.2f" % v
        t = self.med("%s %s timeout" % (case, step))
        if t is not None:
            return "timeout>%.0f" % t
        outcome = self.results.get((case, step), "-")
        return "failed" if outcome.startswith("failed") else ("not run" if outcome == "not run" else "-")

    def _by_rep(self, case: str, step: str, anchor: str) -> str:
        """The range of each rep's ratio to the anchor's median, e.g. "1.40-1.62"."""
        a, vs = self.med("%s %s" % (anchor, step)), self.samples.get("%s %s" % (case, step))
        return "%.2f-%.2f" % (min(vs) / a, max(vs) / a) if a and vs else "-"

    def _goals(self, cases: list) -> None:
        if "gmount" not in cases:
            return
        print()
        goals = [("unpack", "bindfs", GOAL_UNPACK_X_BINDFS)] + [(s, "local", GOAL_X_LOCAL) for s in STEPS[1:]]
        for step, anchor, limit in goals:
            a, v = self.med("%s %s" % (anchor, step)), self.med("gmount %s" % step)
            if step not in STEPS[:STEPS.index(self.a.upto) + 1] or anchor not in cases:
                continue
            if a and v is not None:
                print("goal: %s %.2fx %s (by rep %s; at most %.1fx: %s)"
                      % (step, v / a, anchor, self._by_rep("gmount", step, anchor), limit,
                         holds_text(v / a <= limit)))
            else:
                print("goal: %s at most %.1fx %s: not measured (%s)" % (
                    step, limit, anchor, self.results.get(("gmount", step), "-")))
        for case, what in (("nodebindfs", "a C"), ("nodesshfsm", "our Python")):
            for step in ("configure", "build", "check"):
                a, v = self.med("local %s" % step), self.med("%s %s" % (case, step))
                if a and v is not None:
                    print("ceiling: %s %.2fx local (by rep %s) with %s FUSE mount on every node and "
                          "no namespace (%s)" % (step, v / a, self._by_rep(case, step, "local"), what, case))
        by_host = self.info.get("gmount build compiles")
        if by_host is not None:
            print("goal: compiles on %d hosts (at least %d: %s)" % (len(by_host), GOAL_HOSTS,
                                                                    holds_text(len(by_host) >= GOAL_HOSTS)))

"""The daemon keeps answering while a thousand local agents start.

One persistent client asks `stat` every 50 ms during `explore --local 1000`
and times each answer at the client. Planning a large tree once took 0.9 s on
the daemon's loop at 1,000 agents (quadratic), and a thousand Python starts at
once starved the daemon for seconds; now planning is O(N log N) and local
bootstraps take turns, a few per CPU.
"""
import os
import subprocess
import time

import pytest
from test_explore_local import shared_tmp  # noqa: F401  (fixture)

SCRIPT = r"""
import sys, time
from gxpstyle.gxpc.client import Client
c = Client(sys.argv[1])
assert c.connect(start=False)
times, nodes = [], 0
stop = time.monotonic() + float(sys.argv[2])
done = False
while time.monotonic() < stop and not done:
    # Read the flag first: the stat after it sees the whole tree.
    done = open(sys.argv[3]).read() == "done"
    t = time.monotonic()
    result = c.stat()
    times.append(time.monotonic() - t)
    nodes = len(result["nodes"])
    time.sleep(0.05)
times.sort()
print(len(times), times[len(times) // 2], times[int(len(times) * 0.95)], times[-1], nodes)
"""


def test_stat_answers_during_explore_local_1000(gxp, shared_tmp):  # noqa: F811
    n = 1000
    free_kb = int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0])
    if free_kb < 4 << 20:
        pytest.skip("needs 4 GiB of free memory for %d agents" % n)
    gxp.ok("explore", "--local", "1")
    flag = shared_tmp / "flag"
    flag.write_text("")
    os.chmod(flag, 0o644)
    py = os.path.join(os.path.dirname(gxp.gxpc), "python")
    argv = [py, "-c", SCRIPT, gxp.session_dir, "240", str(flag)]
    if gxp.user:
        watcher = gxp.bed.popen_as(gxp.user, argv, env=gxp.env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    else:
        watcher = subprocess.Popen(argv, env=dict(os.environ, **gxp.env()), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        r = gxp.run("explore", "--local", str(n), timeout=300)
        flag.write_text("done")
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert r.returncode == 0, r.stderr[-2000:]
    assert watcher.returncode == 0, err
    calls, median, p95, worst, nodes = out.split()
    assert int(nodes) == n + 2 and int(calls) > 50
    # Answer times seen by the client, scheduling on a loaded 2-core machine included.
    assert float(p95) < 0.1 and float(worst) < 0.5, out
    gxp.ok("quit", timeout=120)

"""Well-framed hostile requests and messages: the session daemon and an agent
stay up and keep answering.

Every input is a valid frame (wire.encode_frame) carrying a real verb or op
with wrong, missing, nested-wrong, huge or negative fields. Correct behaviour:
a bad request gets a reply (an error in one line, in the user's words); a bad
message is dropped or closes that one connection; the daemon and its agents
live on, and `gxpc e true` answers afterwards.

What the fuzz may not do to the machine: no valid `explore` that starts agents,
no command but `true`, no path outside a nonexistent directory; the daemon runs
under an address-space and process limit, so a daemon that tries to grow without
bound dies of it instead of taking the machine with it.
"""
import collections
import os
import pwd
import select
import socket
import subprocess
import sys
import time
import uuid

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gxpstyle.head import session as gxsession
from gxpstyle.launch import bootstrap
from gxpstyle.protocol import serializer, wire

REQUESTS = 10000          # at least this many requests and messages to the daemon
AGENT_MESSAGES = 10000    # and to the agent's pipe
BATCH = 50
ANSWER_SECONDS = 10.0     # a live daemon answers any request well within this
MEMORY_LIMIT = 2 << 30    # the daemon's address space, bytes
PROCESS_LIMIT = 200       # processes of the test user

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
# Values of every type the serializer carries, hostile sizes and signs included.
junk = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([-3, -1, 0, 1 << 31, 1 << 63, 10 ** 12, -(10 ** 12), 10 ** 40]),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([float("nan"), float("inf"), -1.0, 0.5, 1e308]),
    text, st.binary(max_size=16),
    st.sampled_from(["", "x" * 5000, "../..", "/", "*", "[", "h[1-1000000000000]"]),
    st.lists(st.integers(), max_size=3), st.lists(text, max_size=3),
    st.dictionaries(text, st.integers(), max_size=3),
    st.dictionaries(text, st.lists(st.integers(), max_size=2), max_size=2),
)
env_like = st.one_of(junk, st.sampled_from([[1], {"A": 1}, {"": "x"}, {"=x": "y"}, {"1A": "b"},
                                            {"GXPFUZZ": "1"}, {"A": {"B": "c"}}, {"A": None}]))
rules_like = st.one_of(junk, st.lists(st.one_of(junk, st.sampled_from(
    [{}, {"channel": 5}, {"channel": "nosuch", "src": "*", "dst": "*"},
     {"channel": "ssh", "src": [], "dst": {}}])), max_size=3))
path_like = st.one_of(junk, st.sampled_from(["/nonexistent-gxpfuzz/a", "relative", "",
                                             "/nonexistent-gxpfuzz/a/b"]))

# Per verb: the argument fields the daemon reads, each with hostile values.
# `quit` is left out (it ends the session on purpose). `explore` never gets a
# count of local agents it could honour, nor a target a rule could reach.
VERB_FIELDS = {
    "ping": {},
    "stat": {},
    "smask": {},
    "rmask": {},
    "use": {"rules": rules_like},
    "cd": {"dir": path_like},
    "export": {"env": env_like},
    "savemask": {"name": st.one_of(junk, st.just("m1"))},
    "e": {"cmd": st.one_of(junk, st.just("true")), "env": env_like, "mask": st.one_of(junk, st.just("m1")),
          "hosts": st.one_of(junk, st.sampled_from(["local*", "nosuch", "[a-"])), "cwd": path_like,
          "stdin": junk},
    "job": {"cmd": st.one_of(junk, st.just("true")), "env": env_like, "cwd": path_like,
            "avoid": st.one_of(junk, st.sampled_from([5, "0", [1], {}, ["0"]])),
            "stdin": junk, "target": junk, "inputs": st.one_of(junk, st.just(["/tmp/x", "rel"])),
            "on": st.one_of(junk, st.sampled_from(["local*", "nosuch", "[a-", "0"])),
            "place": st.one_of(junk, st.sampled_from(["hard", "soft", "x"])),
            "slots": st.sampled_from([0, 1, 2, 4096, 4097, -1, "2", None]),
            "dp": st.one_of(junk, st.sampled_from(["local", "collocation:g"]))},
    "where": {"paths": st.one_of(junk, path_like, st.just(["/tmp/x"]))},
    "home": {"phase": st.one_of(junk, st.sampled_from(["plan", "done", "x", ""]))},
    "env": {"env": env_like,
            "pull_threshold": st.sampled_from([-1, 0, 1 << 62, (1 << 62) + 1, "8M", None, 1.5]),
            "transfer_slots": st.sampled_from([0, 1, 64, 65, "1", None]),
            "pull_order": st.one_of(junk, st.sampled_from(["random", "fixed", "x"])),
            "trace": path_like},
    "explore": {"local": st.sampled_from([-3, -1, 10 ** 12, 10001, 1 << 63, "5", [], {}, None, 0.5, -0.5,
                                          float("nan"), float("inf")]),
                "fanout": st.sampled_from([0, -2, 10 ** 12, "8", [], None, float("nan")]),
                "timeout": st.sampled_from([-1, 0, 1e308, float("nan"), float("-inf"), "20", []]),
                "rules": rules_like,
                "targets": st.one_of(st.sampled_from([5, "h1", {}, [1], [None], ["h[1-1000000000000]"]]),
                                     st.lists(junk, max_size=2).filter(
                                         lambda t: not any(isinstance(x, str) for x in t))),
                "host_settings": st.one_of(junk, st.sampled_from([{"h": 5}, {"h": {"fanout": -1}}]))},
    "mount": {"export": path_like, "mountpoint": path_like, "ro": junk, "cipher": junk,
              "allow_other": junk, "cache_size": junk, "options": junk},
    "umount": {"mountpoint": path_like},
    "bcast": {"src": path_like, "dest": path_like, "src_nodes": st.one_of(junk, st.sampled_from(
                  ["local*", "nosuch", "[a-", "0"])), "mask": st.one_of(junk, st.just("m1")),
              "hosts": st.one_of(junk, st.sampled_from(["local*", "nosuch", "[a-"])),
              "progress": junk},
    "nosuchverb": {},
}


def daemon_verbs():
    """Every request verb the daemon serves: its own and every service's,
    plugins included (found the way the daemon finds them)."""
    from unittest import mock

    from gxpstyle.api import services
    from gxpstyle.head.daemon import CORE_SERVICES

    def logless(text):
        raise AssertionError("a service plugin did not load: %s" % text)

    found = {"ping", "stat", "quit"}
    for _, cls in CORE_SERVICES + services.load_plugins(logless):
        found.update(cls(mock.MagicMock()).verbs())
    return found


def test_every_verb_of_the_daemon_is_fuzzed():
    assert daemon_verbs() - {"quit"} <= set(VERB_FIELDS), \
        "a verb was added: give it hostile arguments in VERB_FIELDS"


@st.composite
def hostile_args(draw, verb):
    fields = VERB_FIELDS[verb]
    args = {}
    for name, values in fields.items():
        if draw(st.integers(0, 3)):          # mostly present, sometimes missing
            args[name] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        args[draw(text)] = draw(junk)        # a field nobody asked for
    return args


@st.composite
def request(draw, seq):
    verb = draw(st.sampled_from(sorted(VERB_FIELDS)))
    args = draw(st.one_of(hostile_args(verb), junk)) if draw(st.integers(0, 9)) == 0 \
        else draw(hostile_args(verb))
    return {"op": "request", "req": next(seq), "cmd": verb, "args": args}


def typed_value(spec, depth=0):
    """A value of a schema spec (gxpstyle/protocol/schema.py), nested fields included, or
    of a wrong shape."""
    from gxpstyle.protocol import schema as sc
    if isinstance(spec, sc.Opt):
        good = st.one_of(st.none(), typed_value(spec.spec, depth))
    elif isinstance(spec, sc.Str):
        good = text
    elif isinstance(spec, sc.Int):
        good = st.integers(-(1 << 40), 1 << 40)
    elif isinstance(spec, sc.Num):
        good = st.floats()
    elif isinstance(spec, sc.Bool):
        good = st.booleans()
    elif isinstance(spec, sc.Bytes):
        good = st.binary(max_size=64)
    elif isinstance(spec, sc.Choice):
        good = st.sampled_from(list(spec.values))
    elif depth > 2:
        good = junk
    elif isinstance(spec, sc.ListOf):
        good = st.lists(typed_value(spec.spec, depth + 1), max_size=3)
    elif isinstance(spec, sc.MapOf):
        good = st.dictionaries(text, typed_value(spec.spec, depth + 1), max_size=3)
    elif isinstance(spec, sc.Rec):
        good = st.fixed_dictionaries({}, optional={
            k: typed_value(v, depth + 1) for k, v in list(spec.required.items())
            + list(spec.optional.items())})
    else:
        good = junk
    return st.one_of(good, junk)


@st.composite
def message(draw, forbidden=("quit",), safe=None):
    """Any op of the wire schema with right-shaped or hostile fields (some missing)."""
    op = draw(st.sampled_from(sorted(set(wire.SCHEMA) - set(forbidden))))
    msg = {"op": op}
    rec = wire.SCHEMA[op]
    for field, spec in list(rec.required.items()) + list(rec.optional.items()):
        if draw(st.integers(0, 5)):
            msg[field] = draw(typed_value(spec))
    if safe is not None:
        safe(msg)
    return msg


def only_true(msg):
    # A command is the one thing a fuzz must not pick: it would run it.
    if msg["op"] == "exec" and isinstance(msg.get("cmd"), str):
        msg["cmd"] = "true"
    if msg["op"] == "spawn" and isinstance(msg.get("channel"), dict):
        msg["channel"] = {"name": "nosuch-channel"}
    # Nor a broadcast's file: it would be written where the fuzz says, this big.
    if msg["op"] == "svc_msg" and msg.get("svc") == "bcast" and isinstance(msg.get("body"), dict):
        msg["body"]["dest"] = ""
        msg["body"]["size"] = 1 << 16


def counter():
    n = 0
    while True:
        n += 1
        yield n


def process_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class DaemonConn:
    """A client connection to the session daemon, made as the session's user
    (the daemon accepts only its own uid)."""

    def __init__(self, gxp):
        self.path = gxsession.socket_path(gxp.session_dir)
        self.user = gxp.user
        self.sock = None
        self.reader = None

    def connect(self):
        s = socket.socket(socket.AF_UNIX)
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.setegid(pw.pw_gid)
            os.seteuid(pw.pw_uid)
            try:
                s.connect(self.path)     # the peer's credentials are taken here
            finally:
                os.seteuid(0)
                os.setegid(0)
        else:
            s.connect(self.path)
        self.sock, self.reader = s, wire.FrameReader()

    def send(self, dst, msg):
        """False when the frame could not be sent (the connection was dropped,
        or no daemon accepts a new one)."""
        if self.sock is None:
            try:
                self.connect()
            except (ConnectionRefusedError, FileNotFoundError):
                return False
        try:
            self.sock.sendall(wire.encode_frame(dst, "c", msg))
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.close()
            return False

    def reply_to(self, req, timeout):
        """The reply to request `req`; None if the daemon closed this connection.
        Raises TimeoutError when nothing comes in time."""
        deadline = time.monotonic() + timeout
        while self.sock is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            if not data:
                self.close()
                return None
            for frame in self.reader.feed(data):
                _, _, body = wire.split_frame(frame)
                msg = serializer.loads(body)
                if isinstance(msg, dict) and msg.get("op") == "reply" and msg.get("req") == req:
                    wire.validate(msg)
                    return msg
        return None

    def drain(self):
        while self.sock is not None and select.select([self.sock], [], [], 0)[0]:
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            if not data:
                self.close()
                return
            self.reader.feed(data)

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None


def log_tail(gxp, lines=12):
    try:
        with open(os.path.join(gxp.session_dir, gxsession.LOG_NAME), errors="replace") as f:
            return "daemon log:\n" + "\n".join(f.read().splitlines()[-lines:])
    except OSError as e:
        return "no daemon log (%s)" % e


def check_error_reply(reply, msg):
    """A refusal says what is wrong in one line, in the user's words."""
    if reply["status"] == 0:
        return
    result = reply["result"]
    texts = [result["error"]] if "error" in result else list((result.get("failed") or {}).values())
    assert texts, (msg, reply)
    for t in texts:
        assert isinstance(t, str) and t.strip() and "\n" not in t.strip(), (msg, reply)
        assert "Error:" not in t and "Traceback" not in t, (msg, reply)


def start_limited_session(gxp, *args):
    """The session's first command, under the limits (the daemon it starts, and
    every agent, inherits them; only the process itself may lower them here)."""
    argv = ["prlimit", "--as=%d" % MEMORY_LIMIT, "--nproc=%d" % PROCESS_LIMIT, "--"] + gxp.argv(args)
    if gxp.user:
        r = gxp.bed.run_as(gxp.user, argv, env=gxp.env(), capture_output=True, text=True, timeout=120)
    else:
        r = subprocess.run(argv, env=dict(os.environ, **gxp.env()), capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hostile_requests_and_messages_leave_the_daemon_and_agents_up(gxp):
    start_limited_session(gxp, "explore", "--local", "2")
    (pid,) = gxp.daemon_pids()
    agents = sorted(gxp.agent_pids())
    assert len(agents) == 2
    conn = DaemonConn(gxp)
    seq = counter()
    sent = [0]
    killed_by = []         # the first input after which the daemon was gone

    recent = collections.deque(maxlen=3)

    def daemon_gone():
        killed_by.append("the session daemon died after %d inputs; the last ones: %r\n%s"
                         % (sent[0], list(recent), log_tail(gxp)))
        raise AssertionError(killed_by[0])

    @settings(max_examples=REQUESTS // BATCH, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(request(seq), request(seq), request(seq),
                              message(safe=only_true).map(lambda m: ("msg", m))),
                    min_size=BATCH, max_size=BATCH),
           st.sampled_from(["0", "0.1", "0.2", "0.9", "c1", ""]))
    def fuzz(batch, dst):
        if killed_by:
            raise AssertionError(killed_by[0])   # hypothesis replays the failing batch
        for item in batch:
            if not process_alive(pid):
                daemon_gone()
            recent.append(item)
            sent[0] += 1
            if isinstance(item, tuple):          # a message, not a request
                msg = item[1]
                conn.send(dst if msg["op"] in ("kill", "stdin") else "0", msg)
                conn.drain()
                continue
            if not conn.send("0", item):
                continue
            try:
                reply = conn.reply_to(item["req"], ANSWER_SECONDS)
            except TimeoutError:
                raise AssertionError("no reply within %gs to %r" % (ANSWER_SECONDS, item)) from None
            if reply is None:
                continue                         # this connection was dropped: a new one
            check_error_reply(reply, item)

    try:
        fuzz()
    finally:
        conn.close()
    assert sent[0] >= REQUESTS
    assert process_alive(pid), "the session daemon is gone"
    assert [p for p in agents if not process_alive(p)] == [], "agents died"
    gxp.ok("rmask")          # a mask the fuzz saved may rightly select nobody
    gxp.ok("cd", "/")        # and a directory it chose may rightly exist nowhere
    assert gxp.ok("e", "true", timeout=30).returncode == 0
    # the head and the two agents
    assert sorted(gxp.ok("e", "echo ok", timeout=30).stdout.split()) == ["ok", "ok", "ok"]


# --- an agent's pipe ---------------------------------------------------------

class PipeAgent:
    """An agent started the way a parent starts one: the first stage on a pipe,
    the payload, the hello; then we are its parent "0"."""

    def __init__(self, bed, user):
        self.tag = "%s:fuzz-%s" % (bootstrap.PROCESS_TAG, uuid.uuid4().hex[:8])
        argv = bootstrap.stage1_argv(sys.executable, self.tag)
        kw = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.proc = bed.popen_as(user, argv, **kw) if user else subprocess.Popen(argv, **kw)
        self.reader = wire.FrameReader()
        self.pending = []
        self.out = self.proc.stdout.fileno()
        line = b""
        while bootstrap.MARKER not in line:
            line = self.proc.stdout.readline()
            assert line, "the first stage exited before its marker"
        self.proc.stdin.write(bootstrap.payload_wire(bootstrap.build_payload(bootstrap.head_sources())))
        self.write("0.1", "0", {"op": "hello", "id": "0.1", "name": "fuzz", "session": "fuzz",
                                "secret": os.urandom(32), "opts": {}})
        ready = self.wait(lambda m: m["op"] == "ready", 30)
        self.pid = ready["pid"]

    def write(self, dst, src, msg):
        self.proc.stdin.write(wire.encode_frame(dst, src, msg))
        self.proc.stdin.flush()

    def wait(self, want, timeout):
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.pending):
                if want(m):
                    return self.pending.pop(i)
            self.pending.clear()
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.out], [], [], left)[0]:
                raise AssertionError("the agent said nothing in %gs" % timeout)
            data = os.read(self.out, 1 << 20)
            if not data:
                raise AssertionError("the agent closed its pipe")
            for frame in self.reader.feed(data):
                _, _, body = wire.split_frame(frame)
                try:
                    self.pending.append(wire.decode_message(body))
                except wire.FrameError:
                    pass    # our own junk for "0", routed back up to us

    def stop(self):
        try:
            self.write("0.1", "0", {"op": "quit"})
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        subprocess.run(["pkill", "-KILL", "-f", self.tag])
        self.proc.wait(10)


def test_hostile_messages_on_its_pipe_leave_an_agent_up(user_bed):
    agent = PipeAgent(user_bed, next(iter(user_bed.users)) if user_bed else None)
    seq = counter()
    sent = [0]
    try:
        @settings(max_examples=AGENT_MESSAGES // BATCH, deadline=None, derandomize=True,
                  database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.lists(st.tuples(st.sampled_from(["0.1", "0.1", "0.1", "0.1.3", "0"]),
                                  st.sampled_from(["0", "0", "0.1", "0.2", "c1"]),
                                  message(safe=only_true)),
                        min_size=BATCH, max_size=BATCH))
        def fuzz(batch):
            for dst, src, msg in batch:
                try:
                    agent.write(dst, src, msg)
                except BrokenPipeError:
                    raise AssertionError("the agent died after %d messages; the last one: %r"
                                         % (sent[0], msg)) from None
                sent[0] += 1
            # After each batch the agent still answers its parent.
            req = next(seq)
            agent.write("0.1", "0", {"op": "ping", "req": req})
            agent.wait(lambda m: m["op"] == "pong" and m["req"] == req, ANSWER_SECONDS)

        fuzz()
        assert sent[0] >= AGENT_MESSAGES
        assert process_alive(agent.pid)
        job = 1 << 41      # beyond what the fuzz used as job numbers
        agent.write("0.1", "0", {"op": "exec", "job": job, "cmd": "true", "cwd": None,
                                 "env": {}, "stdin": False})
        done = agent.wait(lambda m: m["op"] == "exit" and m["job"] == job, 30)
        assert done["status"] == 0, done
    finally:
        agent.stop()

"""The elastic pieces that need no job: discovery parsing, blacklist cooldowns, flag
checks, the driver/worker records, ElasticSampler's re-partitioning, and hvd.elastic.run's
retry rules (restore after HorovodInternalError, keep after HostsUpdatedInterrupt).
Plus the launcher's fast failures (a discovery script that fails at once, bad flags)."""
import argparse
import gc
import os
import signal
import stat
import subprocess
import threading
import time

import pytest

from harness import HOROVODLIKERUN, PYTHON, REPO
from horovodlike.common import elastic as proto
from horovodlike.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovodlike.runner import args as cli
from horovodlike.runner import elastic_driver as ed
from horovodlike.runner import launch


def _script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_discovery_script_lines(tmp_path):
    d = ed.ScriptDiscovery(_script(tmp_path, "echo a:2\necho\necho ' b '\necho c:1\n"), 3)
    assert d.find() == {"a": 2, "b": 3, "c": 1}
    assert list(d.find()) == ["a", "b", "c"]          # the script's order is kept
    assert ed.ScriptDiscovery(_script(tmp_path, "true\n"), None).find() == {}


@pytest.mark.parametrize("body,needle", [
    ("echo a\n", "without ':slots'"),
    ("echo a:0\n", "bad host entry"),
    ("echo a:x\n", "bad host entry"),
    ("echo oops >&2; exit 4\n", "exited with code 4: oops"),
])
def test_discovery_script_errors(tmp_path, body, needle):
    with pytest.raises(RuntimeError, match=needle):
        ed.ScriptDiscovery(_script(tmp_path, body), None).find()


def test_cooldown_doubles_and_is_capped(monkeypatch):
    monkeypatch.setattr(ed.random, "uniform", lambda a, b: 0.5)
    h = ed.HostState((10, 30))
    h.blacklist(0.0)
    assert h.blacklisted and h.until == 15.0        # MIN * 2^0 + 0.5 * MIN
    assert not h.resurrected(14.0) and h.resurrected(15.0)
    h.blacklist(5.0)                                # inside the cooldown: no new period
    assert h.until == 15.0
    h.whitelist()
    h.blacklist(100.0)
    assert h.until == 100.0 + 25.0                  # MIN * 2^1 + 5
    h.whitelist()
    h.blacklist(200.0)
    assert h.until == 200.0 + 30.0                  # capped at MAX
    forever = ed.HostState(None)
    forever.blacklist(0.0)
    assert forever.blacklisted and not forever.resurrected(1e9)


def _args(argv):
    return launch.parse_args(argv + ["python", "x.py"])


@pytest.mark.parametrize("argv,needle", [
    (["-np", "2", "--min-np", "3", "--host-discovery-script", "x"], "--min-np (3) <= -np (2)"),
    (["-np", "4", "--max-np", "3", "--host-discovery-script", "x"], "<= --max-np (3)"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "0", "--host-discovery-script", "x"],
     "--elastic-timeout must be positive"),
    (["-np", "2", "--blacklist-cooldown-range", "0", "5", "--host-discovery-script", "x"],
     "MIN <= MAX <= 3600"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1", "--host-discovery-script", "x"],
     "--reset-limit must be >= 0"),
])
def test_settings_are_checked(argv, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        ed.Settings(_args(argv))


def test_settings_defaults(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "42")
    s = ed.Settings(_args(["-np", "3", "--host-discovery-script", "x"]))
    assert (s.min_np, s.max_np, s.timeout, s.reset_limit) == (3, 3, 42, None)
    assert ed.is_elastic(_args(["-np", "3", "--min-np", "2", "-H", "a:2,b:2"]))
    assert not ed.is_elastic(_args(["-np", "3"]))
    fixed = ed.Settings(_args(["-np", "3", "--min-np", "2", "-H", "a:2,b:2"]))
    assert fixed.discovery.find() == {"a": 2, "b": 2}


def test_elastic_flags_defined_elsewhere_win():
    p = argparse.ArgumentParser()
    p.add_argument("--min-np", dest="theirs", type=int)
    cli.add_elastic_args(p)
    args = p.parse_args(["--min-np", "2", "--max-np", "4"])
    assert args.theirs == 2 and args.max_num_proc == 4


def test_worker_records_are_checked():
    assert proto.parse_ready(b"3 7 failure") == (3, 7, "failure", None)
    assert proto.parse_ready(b"3 7 failure 1") == (3, 7, "failure", 1)
    for bad in (b"3 7 bogus", b"3 7", b"x 7 new", b"1 2 new " + b"x" * 600):
        with pytest.raises(ValueError):
            proto.parse_ready(bad)
    a = proto.Assignment(4, 1, 3, True, 9)
    b = proto.Assignment.decode(4, a.encode().split()[1:])
    assert (b.round, b.rank, b.size, b.sync, b.update_seq) == (4, 1, 3, True, 9)
    for fields in (["3", "3", "0", "0"], ["0", "2", "2", "0"], ["0", "1", "0", "-1"]):
        with pytest.raises(ValueError):
            proto.Assignment.decode(0, fields)


def test_elastic_sampler_repartitions_what_is_left(monkeypatch):
    torch_elastic = pytest.importorskip("horovodlike.torch.elastic")
    world = {"size": 3, "rank": 0}
    monkeypatch.setattr(torch_elastic, "size", lambda: world["size"])
    monkeypatch.setattr(torch_elastic, "rank", lambda: world["rank"])
    data = list(range(20))
    samplers = []
    for r in range(3):
        world["rank"] = r
        samplers.append(torch_elastic.ElasticSampler(data, shuffle=True, seed=3))
    seen = set()
    for s in samplers:                     # one batch of 2 on each of the 3 ranks
        seen.update(list(s)[:2])
        s.record_batch(0, 2)
    assert all(s.processed_num == 6 for s in samplers)
    world["size"] = 2                      # a reset: two ranks share the other 14
    rest = []
    for r, s in enumerate(samplers[:2]):
        world["rank"] = r
        s.reset()
        rest.append(list(s))
    assert len(rest[0]) == len(rest[1]) == 7
    assert set(rest[0]) | set(rest[1]) == set(data) - seen
    assert not set(rest[0]) & set(rest[1])
    s = samplers[0]
    s.set_epoch(1)
    assert s.processed_num == 0 and len(s) == 10


class _Recorder(proto.ObjectState):
    def __init__(self, **kw):
        self.calls = []
        super().__init__(bcast_object=lambda obj: obj, get_rank=lambda: 0, **kw)

    def sync(self):
        self.calls.append("sync")
        super().sync()

    def restore(self):
        self.calls.append("restore")
        super().restore()


def test_run_restores_after_internal_error_and_keeps_after_interrupt():
    state = _Recorder(epoch=0)
    resets = []
    attempts = iter([HorovodInternalError("lost"), HostsUpdatedInterrupt(skip_sync=True), None])

    def train(st):
        st.epoch += 1                       # uncommitted progress
        error = next(attempts)
        if error is not None:
            raise error
        return st.epoch

    state.register_reset_callbacks([lambda: resets.append(state.epoch)])
    result = proto.run_fn(train, lambda: resets.append("reset"))(state)
    # sync, fail -> restore (epoch back to 0) -> reset -> sync, +1, interrupt (kept at 1,
    # Horovod's skip_sync honoured outside the driver) -> reset -> +1
    assert state.calls == ["sync", "restore", "sync"]
    assert resets == ["reset", 0, "reset", 1]
    assert result == 2


def test_launcher_fails_at_once_when_discovery_fails(tmp_path):
    script = _script(tmp_path, "echo no hosts for you >&2; exit 3\n")
    head = [HOROVODLIKERUN] if HOROVODLIKERUN else [PYTHON, "-m", "horovodlike.runner"]
    res = subprocess.run([*head, "-np", "2", "--host-discovery-script", script,
                          PYTHON, "-c", "pass"], capture_output=True, text=True, timeout=60,
                         cwd=str(REPO))
    assert res.returncode == 1, res
    assert "exited with code 3: no hosts for you" in res.stderr
    bad = subprocess.run([*head, "-np", "2", "--min-np", "3", "--host-discovery-script",
                          script, PYTHON, "-c", "pass"], capture_output=True, text=True,
                         timeout=60, cwd=str(REPO))
    assert bad.returncode == 2 and "--min-np (3) <= -np (2)" in bad.stderr, bad


def test_interrupt_keeps_uncommitted_attributes_through_the_sync():
    """After HostsUpdatedInterrupt the sync hands on the state as it is, not the last
    commit (Horovod moved plain attributes back to their committed values)."""
    state = _Recorder(epoch=0)
    attempts = iter([HostsUpdatedInterrupt(skip_sync=False), None])

    def train(st):
        st.epoch += 1
        error = next(attempts)
        if error is not None:
            raise error
        return st.epoch

    assert proto.run_fn(train, lambda: None)(state) == 2
    assert state.calls == ["sync", "sync"]


# ---------------------------------------------------------------- a large host list

def test_20000_hosts_cost_under_a_tenth_of_a_second_per_poll(monkeypatch, tmp_path):
    """Parsing a discovery's 20,000 lines and handling them is linear, poll after poll,
    with the list changing every time (a list membership test made each poll
    quadratic: 9 s per poll)."""
    d = ed.ElasticDriver(ed.Settings(_args(["-np", "2", "--min-np", "1", "--max-np", "4",
                                            "--host-discovery-script", "x"])),
                         _args(["-np", "2"]))
    started = []
    monkeypatch.setattr(d, "spawn", lambda host, slot: started.append((host, slot)))
    d.started = True
    # Two answers: one host leaves, another comes, and back again.
    outs = ["".join(f"node{i:05d}:2\n" for i in range(k, 20000 + k)).encode() for k in (0, 1)]
    discovery = ed.ScriptDiscovery("x", None)
    d.on_hosts(discovery.parse(outs[0], b"", 0))           # the first poll finds them all
    # The cost is the CPU time this thread spends (a busy machine makes the wall clock
    # wait for a CPU, not the poll cost more), the best of five with the collector off,
    # as timeit does (this test process's heap is not the driver's).
    took = []
    gc.collect()
    gc.disable()
    try:
        for poll in range(1, 6):                           # the polls after it
            t0 = time.thread_time()
            hosts = discovery.parse(outs[poll % 2], b"", 0)
            d.on_hosts(hosts)
            took.append(time.thread_time() - t0)
            assert len(hosts) == 20000 and len(d.order) == 20000
    finally:
        gc.enable()
    assert min(took) < 0.1, f"CPU seconds per poll of 20,000 hosts: {took}"
    order = list(d.order)
    assert order[:2] == ["node00001", "node00002"] and order[-1] == "node20000"
    assert d.available_slots() == 40000 and started


# ---------------------------------------------------------------- garbage slot counts

@pytest.mark.parametrize("line", ["a:-1", "a:0", "a:", "a:1e3", "a:\u0663", "a:99999",
                                  "a:18446744073709551617", "a: 2"])
def test_garbage_slot_counts_are_refused(tmp_path, line):
    with pytest.raises(RuntimeError, match="bad host entry"):
        ed.ScriptDiscovery("x", None).parse(line.encode() + b"\n", b"", 0)
    with pytest.raises(ValueError, match="bad host entry"):
        launch.parse_hosts(line)


@pytest.mark.parametrize("slots", ["0", "5000"])
def test_slots_per_host_is_bounded(slots):
    with pytest.raises(ValueError, match="--slots-per-host must be from 1 to 4096"):
        ed.Settings(_args(["-np", "2", "--slots-per-host", slots,
                           "--host-discovery-script", "x"]))


# ---------------------------------------------------------------- a hanging discovery

def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid, seconds=5.0):
    end = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.timeout(30)
def test_hanging_discovery_script_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "pid"
    script = _script(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    d = ed.ScriptDiscovery(script, None, timeout=0.5)
    with pytest.raises(RuntimeError, match="ran longer than 0.5 s; its processes were killed"):
        d.find()
    assert _wait_gone(int(pidfile.read_text())), "the script's child outlived its timeout"


@pytest.mark.timeout(30)
def test_closing_discovery_kills_a_running_script(tmp_path):
    pidfile = tmp_path / "pid"
    script = _script(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    d = ed.ScriptDiscovery(script, None)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, d.find)))
    t.start()
    while not pidfile.exists() or not pidfile.read_text().strip():
        t.join(0.05)
    d.close()
    t.join(10)
    assert not t.is_alive() and errors
    assert _wait_gone(int(pidfile.read_text()))
    with pytest.raises(RuntimeError, match="the job is ending"):
        d.find()


# ---------------------------------------------------------------- a quiet member

@pytest.mark.timeout(30)
def test_member_quiet_while_its_peers_wait_is_dropped(monkeypatch):
    """A member nobody named, stopped while the other is back and waiting for the next
    round: after --shutdown-grace without output or CPU time it is killed and its host
    blacklisted; the member that came back is left alone."""
    args = _args(["-np", "2", "--min-np", "1", "--shutdown-grace", "0.5", "-H", "a:1,b:1"])
    d = ed.ElasticDriver(ed.Settings(args), args)
    written = []
    monkeypatch.setattr(d, "client", type("C", (), {"set": lambda s, k, v: written.append(k)})(),
                        raising=False)
    monkeypatch.setattr(d, "spawn", lambda host, slot: None)
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        os.kill(procs[1].pid, signal.SIGSTOP)
        members = []
        for wid, (host, proc) in enumerate(zip("ab", procs)):
            w = d.workers[wid] = ed.Worker(wid, host, 0)
            w.state, w.rank = ed.MEMBER, wid
            d.job.procs[wid] = proc
            members.append(w)
        members[0].ready = "failure"
        d.members, d.round_no, d.reset_wanted, d.started = members, 0, True, True
        end = time.monotonic() + 10
        while members[1].state == ed.MEMBER and time.monotonic() < end:
            d.check_quiet_members(time.monotonic())
            time.sleep(0.1)
        assert members[1].state == ed.LEAVING and d.host_state["b"].blacklisted
        assert procs[1].wait(timeout=5) == -signal.SIGKILL
        assert members[0].state == ed.MEMBER and procs[0].poll() is None
        assert not d.host_state["a"].blacklisted
    finally:
        for p in procs:
            p.kill()
            p.wait()

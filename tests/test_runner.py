"""End-to-end tests of horovodlikerun and the rendezvous store.

The launcher is always run as a real subprocess so that process groups,
signals and output relaying are exercised exactly as users see them.
"""

import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import rank_program  # noqa: E402
from horovodlike.runner.launch import compute_plan, parse_hosts  # noqa: E402
from horovodlike.common import jobkey  # noqa: E402
from horovodlike.common.store import StoreClient, StoreServer  # noqa: E402

KEY = jobkey.generate()

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

PRINT_ENV = str(rank_program("runner_print_env"))


def launcher_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_launcher(args, timeout=60, cwd=None, **env):
    return subprocess.run(
        [sys.executable, "-m", "horovodlike.runner", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=launcher_env(**env))


def rank_lines(stdout, stream="stdout"):
    """{rank: [lines]} from the launcher's prefixed output."""
    out = {}
    for line in stdout.splitlines():
        head, sep, rest = line.partition(f"]<{stream}>:")
        if sep and head.startswith("["):
            out.setdefault(int(head[1:]), []).append(rest)
    return out


def rank_json(stdout):
    return {r: json.loads(lines[-1]) for r, lines in rank_lines(stdout).items()}


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reparented grandchild may linger as a zombie if nothing reaps it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def python_rank(name, *args):
    """The command that runs rank program tests/ranks/<name>.py with args."""
    return [sys.executable, str(rank_program(name)), *args]


# --------------------------------------------------------------- planning


def test_plan_uneven_hosts_follows_horovod_cross_rank_definition():
    plan = compute_plan(parse_hosts("a:2,b:1,c:4"), 4)
    got = [(s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
           for s in plan]
    assert got == [("a", 0, 2, 0, 3), ("a", 1, 2, 0, 1),
                   ("b", 0, 1, 1, 3), ("c", 0, 1, 2, 3)]


def test_too_few_slots_is_an_error():
    res = run_launcher(["-np", "3", "-H", "localhost:2", "true"])
    assert res.returncode != 0
    assert "-np 3" in res.stderr and "2" in res.stderr


# ------------------------------------------------------------ environment


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_rank_environment_on_localhost(np_):
    res = run_launcher(["-np", str(np_), sys.executable, PRINT_ENV])
    assert res.returncode == 0, res.stderr
    envs = rank_json(res.stdout)
    assert sorted(envs) == list(range(np_))
    job_ids = {e["HOROVODLIKE_JOB_ID"] for e in envs.values()}
    assert len(job_ids) == 1 and len(job_ids.pop()) >= 8
    for rank, e in envs.items():
        assert e["HOROVOD_RANK"] == str(rank)
        assert e["HOROVOD_SIZE"] == e["HOROVOD_LOCAL_SIZE"] == str(np_)
        assert e["HOROVOD_LOCAL_RANK"] == str(rank)
        assert (e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) == ("0", "1")
        assert e["HOROVOD_HOSTNAME"] == socket.gethostname()
        assert e["HOROVODLIKE_STORE_ADDR"].startswith("127.0.0.1:")
        assert e["PYTHONUNBUFFERED"] == "1"


def test_fake_remote_hosts_get_cwd_env_and_topology(tmp_path):
    # `env -i` proves the variables travel inside the command line, and the
    # inner `cd /` proves the command itself restores the working directory.
    ssh = 'env -i /bin/sh -c "cd / && exec /bin/sh -c {command}"'
    res = run_launcher(
        ["-np", "4", "-H", "a:2,b:2", "--ssh-command", ssh, "--verbose",
         sys.executable, PRINT_ENV],
        cwd=tmp_path, MY_TEST_VAR="it's a $VALUE; with spaces",
        HOROVODLIKE_STORE_HOST="127.0.0.1")
    assert res.returncode == 0, res.stderr
    envs = rank_json(res.stdout)
    expected = {0: ("a", 0, 0), 1: ("a", 1, 0), 2: ("b", 0, 1), 3: ("b", 1, 1)}
    for rank, (host, local, cross) in expected.items():
        e = envs[rank]
        assert e["HOROVOD_HOSTNAME"] == host
        assert e["HOROVOD_LOCAL_RANK"] == str(local)
        assert e["HOROVOD_LOCAL_SIZE"] == "2"
        assert e["HOROVOD_CROSS_RANK"] == str(cross)
        assert e["HOROVOD_CROSS_SIZE"] == "2"
        assert e["cwd"] == str(tmp_path)
        assert e["MY_TEST_VAR"] == "it's a $VALUE; with spaces"
        assert e["HOROVODLIKE_STORE_ADDR"].startswith("127.0.0.1:")
    assert "rank 3 -> b" in res.stderr


def test_tuning_flags_become_env_vars():
    res = run_launcher([
        "-np", "1", "--fusion-threshold-mb", "1.5", "--cycle-time-ms", "2.5",
        "--cache-capacity", "64", "--timeline-filename", "/x/t.json",
        "--timeline-mark-cycles", "--no-stall-check",
        "--stall-check-warning-time-seconds", "30",
        "--stall-check-shutdown-time-seconds", "90", "--log-level", "debug",
        "--hierarchical-allreduce", "--start-timeout", "7",
        sys.executable, PRINT_ENV, "HOROVOD"])
    assert res.returncode == 0, res.stderr
    env = rank_json(res.stdout)[0]
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(int(1.5 * 1048576))
    assert env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert env["HOROVOD_CACHE_CAPACITY"] == "64"
    assert env["HOROVOD_TIMELINE"] == "/x/t.json"
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "90"
    assert env["HOROVOD_LOG_LEVEL"] == "DEBUG"
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HOROVODLIKE_START_TIMEOUT"] == "7"


# ----------------------------------------------------------------- output


def test_user_flags_pass_through_untouched():
    res = run_launcher(["-np", "1", sys.executable, "-c",
                        "import sys; print(sys.argv[1:])",
                        "--foo", "1", "-np", "5", "-H", "x", "--verbose"])
    assert res.returncode == 0, res.stderr
    assert rank_lines(res.stdout)[0] == [
        "['--foo', '1', '-np', '5', '-H', 'x', '--verbose']"]
    assert "store at" not in res.stderr  # --verbose went to the user command


def test_output_prefixes_partial_lines_and_binary_junk():
    res = run_launcher(["-np", "2", *python_rank("runner_output_junk")])
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        assert rank_lines(res.stdout)[rank] == ["line one", "partial \ufffd\ufffd"]
        assert rank_lines(res.stderr, "stderr")[rank] == ["warn"]


# ---------------------------------------------------------------- failure


def test_failing_rank_stops_the_job_and_leaves_nothing_behind(tmp_path):
    # Rank 0 has a grandchild (same process group); rank 2 ignores SIGTERM
    # so the launcher must escalate to SIGKILL after its grace period.
    start = time.monotonic()
    res = run_launcher(["-np", "3", *python_rank("runner_failing_rank", str(tmp_path))])
    elapsed = time.monotonic() - start
    assert res.returncode == 3, res.stderr
    assert f"rank 1 (host {socket.gethostname()}) exited with code 3" in res.stderr
    assert "rank 0" not in res.stderr and "rank 2" not in res.stderr
    assert elapsed < 30
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)]


def test_rank_killed_by_signal_is_reported():
    start = time.monotonic()
    res = run_launcher(["-np", "2", *python_rank("runner_killed_rank")])
    assert res.returncode == 128 + 9
    assert f"rank 1 (host {socket.gethostname()}) was killed by signal 9 (SIGKILL)" in res.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("code, text, status", [
    (3, "exited with code 3", 3),
    (-9, "was killed by signal 9 (SIGKILL)", 137),
    # A rank behind ssh or sh -c: the shell reports its signal death as 128 + N.
    (137, "exited with code 137 (killed by SIGKILL?)", 137),
    (200, "exited with code 200", 200),            # 128 + 72: no such signal
])
def test_both_launchers_describe_an_exit_alike(code, text, status):
    from horovodlike.runner import elastic_driver, exits, launch
    slot = launch.RankSlot(1, "localhost", 1, 2, 0, 1)
    assert launch.describe_exit(slot, code) == (
        f"rank 1 (host {socket.gethostname()}) {text}", status)
    # The elastic driver says the same words after "worker W (host H, rank R)".
    assert exits.exit_text(code) == text
    assert not hasattr(elastic_driver, "_exit_text")


def test_launcher_names_the_rank_that_failed_first_not_the_first_to_exit():
    from harness import run_ranks
    res = run_ranks(rank_program("runner_cause_exits_last"), 3, timeout=90)
    assert res.returncode == 1, res.describe()
    said = [line for line in res.stderr.splitlines() if line.startswith("horovodlikerun:")]
    host = socket.gethostname()
    # A victim (rank 0 or 1) exits first; the line names rank 2 and its own error ...
    assert said and said[0].startswith(
        f"horovodlikerun: rank 2 (host {host}) failed first (ValueError: rank two's "
        f"optimizer step failed)"), res.describe()
    assert "rank 2 (host" not in said[0].split(";", 1)[1], said[0]
    # ... and the others are listed as its victims.
    assert f"horovodlikerun: ranks 0, 1 failed as victims of rank 2 (host {host})" in \
        res.stderr, res.describe()


def test_blame_prefers_the_named_rank_then_the_earliest_own_error():
    from horovodlike.runner.blame import Blame
    b = Blame()
    b.observe(0, b"Traceback (most recent call last):", 1.0)
    b.observe(0, b"horovodlike.common.exceptions.HorovodInternalError: rank 3 (host h) was "
                 b"lost: its connection closed", 1.1)
    b.observe(3, b"Traceback (most recent call last):", 0.5)
    b.observe(3, b"  File \"x.py\", line 1", 0.5)
    b.observe(3, b"ValueError: bad", 0.6)
    assert b.cause(0, range(4)) == (3, 0, "was lost")
    assert b.exception[3] == "ValueError: bad"
    assert b.victims(3, {0, 1}) == [0, 1]
    # Nobody names anyone: the earliest own error, not the first to exit.
    b = Blame()
    b.observe(1, b"Traceback (most recent call last):", 2.0)
    b.observe(2, b"[horovodlike rank 2] ERROR: stall: 'x' has waited 60 s", 1.0)
    assert b.cause(1, range(4)) == (2, None, "failed first")
    assert Blame().cause(1, range(4)) == (1, None, None)
    # One verdict on every rank (a deadlock): nobody is singled out, nobody a victim.
    b = Blame()
    for r, t in ((0, 1.0), (1, 1.2)):
        b.observe(r, b"Traceback (most recent call last):", t)
        b.observe(r, b"HorovodInternalError: deadlock: rank 0 waits in allreduce 'a'", t)
    assert b.cause(1, range(2)) == (1, None, None)
    assert b.victims(1, {0, 1}) == []


def test_missing_executable_fails_cleanly():
    res = run_launcher(["-np", "2", "/nonexistent/horovodlike-binary"])
    assert res.returncode == 127
    assert "failed to start rank 0" in res.stderr


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_is_forwarded_to_ranks(sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovodlike.runner", "-np", "2",
         *python_rank("runner_catch_signal", str(int(sig)))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=launcher_env())
    lines = queue.Queue()
    reader = threading.Thread(
        target=lambda: [lines.put(l) for l in proc.stdout], daemon=True)
    reader.start()
    try:
        seen = set()
        while len(seen) < 2:
            line = lines.get(timeout=30)
            if line.endswith("<stdout>:ready\n"):
                seen.add(line)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        proc.kill()
        proc.wait()
    reader.join(timeout=10)
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    caught = [l for l in rest if f"caught {sig.name}" in l]
    assert len(caught) == 2, rest
    assert sig.name in proc.stderr.read()


# ------------------------------------------------------------------ store


def test_store_exchange_across_ranks():
    res = run_launcher(["-np", "3", *python_rank("runner_store_exchange")])
    assert res.returncode == 0, res.stderr
    for rank, lines in rank_lines(res.stdout).items():
        assert lines == ["ok ['v0', 'v1', 'v2']"]


def test_store_get_timeout_names_key_and_address():
    with StoreServer(key=KEY) as server, StoreClient(server.address, timeout=5, key=KEY) as c:
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            c.get("never/set", timeout=0.3)
        assert time.monotonic() - start < 3
        assert "never/set" in str(info.value)
        assert server.address in str(info.value)
        c.set("after", b"still usable")  # the connection survived the timeout
        assert c.get("after") == b"still usable"


def test_store_blocking_get_wakes_on_set_and_handles_odd_values():
    with StoreServer(key=KEY) as server:
        with StoreClient(server.address, key=KEY) as waiter, \
                StoreClient(server.address, key=KEY) as setter:
            result = []
            t = threading.Thread(target=lambda: result.append(waiter.get("ключ")))
            t.start()
            time.sleep(0.2)
            setter.set("ключ", b"\x00\xff" * 3)
            t.join(timeout=5)
            assert result == [b"\x00\xff" * 3]
            setter.set("empty", b"")
            assert waiter.get("empty") == b""
            assert [setter.add("n"), setter.add("n", 5)] == [1, 6]


def test_store_rejects_stray_connections():
    with StoreServer(key=KEY) as server, StoreClient(server.address, key=KEY) as good:
        good.set("k", b"v")
        host, port = server.address.rsplit(":", 1)
        for junk in (b"GET / HTTP/1.0\r\n\r\n" + b"x" * 60, b"HVLS" + b"\xff" * 100):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(junk)
                hello = s.recv(37, socket.MSG_WAITALL)
                assert hello[:4] == b"HVLS"      # the server's challenge, then nothing
                assert s.recv(100) == b""        # dropped without a reply
        assert good.get("k") == b"v"
        with StoreClient(server.address, key=KEY) as fresh:
            assert fresh.get("k") == b"v"


def test_store_client_retries_until_server_appears():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    result = []

    def connect():
        with StoreClient(f"127.0.0.1:{port}", timeout=10, key=KEY) as c:
            result.append(c.get("k", timeout=5))

    t = threading.Thread(target=connect)
    t.start()
    time.sleep(0.5)
    with StoreServer("127.0.0.1", port, key=KEY) as server:
        with StoreClient(server.address, key=KEY) as setter:
            setter.set("k", b"late")
        t.join(timeout=10)
    assert result == [b"late"]

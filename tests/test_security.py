"""A hostile process on the same machine, and the input checks that keep memory safe.

The outsider knows the store's address (it can read it from `ps` or /proc/net/tcp) but
not the job's key: it must not read, write, replay or slow down the store. The key must
never appear on a command line. Killing the launcher, even with SIGKILL, ends every
rank. An interrupted wait never lets the engine write into freed memory, and handles
never outlive an engine. Each test causes the failure it guards against.
"""
import glob
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from harness import PYTHON, REPO, kill_tree, rank_program
from horovodlike.common import bootstrap, jobkey, store as store_mod
from horovodlike.common.store import StoreAuthError, StoreClient, StoreServer

pytestmark = pytest.mark.timeout(120)
KEY = jobkey.generate()


# ------------------------------------------------------------------ the store


def _raw(server):
    host, port = server.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _handshake(sock, key):
    """Our own client's handshake, by hand, so tests can then send arbitrary frames."""
    hello = sock.recv(store_mod._HELLO.size, socket.MSG_WAITALL)
    _, _, sn = store_mod._HELLO.unpack(hello)
    cn = os.urandom(32)
    sock.sendall(store_mod.MAGIC + cn + jobkey.mac(key, b"client", sn, cn))
    assert sock.recv(32, socket.MSG_WAITALL) == jobkey.mac(key, b"server", sn, cn)
    return store_mod._Session(key, sn, cn)


def _frame(session, op, key, value):
    header = store_mod._REQ.pack(store_mod.MAGIC, op, len(key), len(value))
    return header + key + value + session.request_mac(header, key, value)


def _closed(sock):
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        return True


def test_a_client_without_the_key_cannot_connect_read_or_plant():
    reports = []
    with StoreServer(key=KEY, on_reject=reports.append) as server:
        with StoreClient(server.address, key=KEY) as good:
            good.set("job/init0/blob/1", b"the real blob")
        with pytest.raises(StoreAuthError):
            StoreClient(server.address, key=jobkey.generate(), timeout=5)
        # An outsider speaking the old, unauthenticated protocol: a SET that would plant
        # a value under a rank's key. It is dropped before the frame is read.
        with _raw(server) as s:
            s.recv(store_mod._HELLO.size, socket.MSG_WAITALL)
            key, value = b"job/init0/blob/0", b"cos\nsystem\n(S'echo pwned'\ntR."
            s.sendall(store_mod._REQ.pack(store_mod.MAGIC, store_mod.OP_SET, len(key),
                                          len(value)) + key + value)
            assert _closed(s)
        with StoreClient(server.address, key=KEY) as good:
            assert good.get("job/init0/blob/1") == b"the real blob"
            with pytest.raises(TimeoutError):
                good.get("job/init0/blob/0", timeout=0.2)
    assert len(reports) == 2 and all("127.0.0.1:" in r for r in reports), reports


def test_the_store_proves_the_key_too():
    """A rank never talks to an impostor listening where the store should be."""
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen()

    def impostor():
        conn, _ = fake.accept()
        with conn:
            conn.sendall(store_mod._HELLO.pack(store_mod.MAGIC, store_mod.VERSION,
                                               os.urandom(32)))
            conn.recv(68, socket.MSG_WAITALL)
            conn.sendall(os.urandom(32))     # a guess at the proof
            time.sleep(1)

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    with pytest.raises(StoreAuthError, match="does not know this job's key"):
        StoreClient(f"127.0.0.1:{fake.getsockname()[1]}", key=KEY, timeout=5)
    fake.close()


def test_silent_connections_do_not_slow_the_store():
    with StoreServer(key=KEY) as server:
        silent = [_raw(server) for _ in range(50)]
        try:
            start = time.monotonic()
            with StoreClient(server.address, key=KEY) as good:
                good.set("k", b"v")
                assert good.get("k") == b"v"
            assert time.monotonic() - start < 3.0
        finally:
            for s in silent:
                s.close()


def test_a_replayed_or_altered_frame_is_refused():
    with StoreServer(key=KEY) as server:
        with _raw(server) as s:
            session = _handshake(s, KEY)
            frame = _frame(session, store_mod.OP_ADD, b"counter", struct.pack(">q", 1))
            s.sendall(frame)
            head = s.recv(store_mod._RESP.size, socket.MSG_WAITALL)
            assert store_mod._RESP.unpack(head)[1] == store_mod.ST_OK
            s.recv(8 + 32, socket.MSG_WAITALL)
            s.sendall(frame)                 # the same bytes again
            assert _closed(s)
        with _raw(server) as s:
            session = _handshake(s, KEY)
            frame = bytearray(_frame(session, store_mod.OP_ADD, b"counter",
                                     struct.pack(">q", 1)))
            frame[-40] ^= 1                  # one bit of the value flipped
            s.sendall(bytes(frame))
            assert _closed(s)
        with StoreClient(server.address, key=KEY) as good:
            assert good.add("counter", 0) == 1


def test_a_client_gone_mid_frame_is_not_called_a_forger():
    """A rank killed in the middle of a request leaves a short frame: the store drops the
    connection quietly and reports nothing."""
    reports = []
    with StoreServer(key=KEY, on_reject=reports.append) as server:
        with _raw(server) as s:
            session = _handshake(s, KEY)
            s.sendall(_frame(session, store_mod.OP_SET, b"k", b"v" * 100)[:-20])
        with StoreClient(server.address, key=KEY) as c:   # served after that one ended
            c.set("k2", b"v")
            with pytest.raises(TimeoutError):
                c.get("k", timeout=0.2)
    assert reports == []


def test_lengths_and_timeouts_are_bounded():
    with StoreServer(key=KEY) as server:
        with _raw(server) as s:
            _handshake(s, KEY)
            # A header announcing a huge value: refused before anything is buffered.
            s.sendall(store_mod._REQ.pack(store_mod.MAGIC, store_mod.OP_SET, 1, 1 << 40)
                      + b"k")
            assert _closed(s)
        with _raw(server) as s:
            session = _handshake(s, KEY)
            s.sendall(_frame(session, store_mod.OP_GET, b"k", struct.pack(">d", float("nan"))))
            head = s.recv(store_mod._RESP.size, socket.MSG_WAITALL)
            _, status, n = store_mod._RESP.unpack(head)
            assert status == store_mod.ST_ERROR
            assert b"timeout" in s.recv(n, socket.MSG_WAITALL)
        with StoreClient(server.address, key=KEY) as c:
            with pytest.raises(ValueError, match="timeout"):
                c.get("k", timeout=float("nan"))
            with pytest.raises(ValueError, match="limit"):
                c.set("k", b"\0" * (store_mod.MAX_VALUE_LEN + 1))
            c.set("still", b"usable")
            assert c.get("still") == b"usable"


def test_a_trickled_handshake_is_cut_at_one_deadline_for_the_whole_handshake(monkeypatch):
    """A byte every 0.4 s keeps each recv under the limit; the handshake as a whole must
    still end at HANDSHAKE_SECONDS, or trickling peers would hold connection slots."""
    import select
    monkeypatch.setattr(store_mod, "HANDSHAKE_SECONDS", 1.0)
    with StoreServer(key=KEY) as server, _raw(server) as s:
        s.recv(store_mod._HELLO.size, socket.MSG_WAITALL)
        start = time.monotonic()
        closed_after = None
        for _ in range(12):                  # 12 bytes of 68: about 5 s if never cut
            try:
                s.sendall(b"H")
            except OSError:
                closed_after = time.monotonic() - start
                break
            if select.select([s], [], [], 0.4)[0] and _closed(s):
                closed_after = time.monotonic() - start
                break
        assert closed_after is not None, "a trickling client kept its handshake open"
        assert closed_after < 2.0, closed_after


def test_many_ranks_connecting_at_once_are_queued_not_dropped():
    """Connections the server has not accepted yet wait in the listen backlog; with
    socketserver's default of 5, the sixth and later SYNs are dropped and retried a
    second later."""
    server = StoreServer(key=KEY)            # listening, but not accepting yet
    socks = []
    try:
        for _ in range(64):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.5))
    finally:
        for s in socks:
            s.close()
        server.close()
    assert len(socks) == 64


def test_keys_count_toward_the_store_cap(monkeypatch):
    monkeypatch.setattr(store_mod, "MAX_TOTAL", 3 * 4000)
    with StoreServer(key=KEY) as server, StoreClient(server.address, key=KEY) as c:
        with pytest.raises(RuntimeError, match="store is full"):
            for i in range(10):               # empty values: only the keys take room
                c.set(f"{i}".ljust(4000, "k"), b"")
        assert i == 3
        with pytest.raises(RuntimeError, match="store is full"):
            c.add("c".ljust(4000, "k"))      # a new counter's key too
        c.set("0".ljust(4000, "k"), b"")     # replacing an entry does not grow the store


def test_address_entries_are_plain_bytes_checked_on_the_way_in():
    entry = bootstrap.pack_peer("node-1", b"\1" * 256)
    assert bootstrap.unpack_peer(entry, 256, "rank 3") == ("node-1", b"\1" * 256)
    with pytest.raises(RuntimeError, match="rank 3"):
        bootstrap.unpack_peer(entry[:-1], 256, "rank 3")
    bad = bytearray(entry)
    bad[0] = 0
    with pytest.raises(RuntimeError, match="rank 3.*host name"):
        bootstrap.unpack_peer(bytes(bad), 256, "rank 3")
    with pytest.raises(ValueError):
        bootstrap.pack_peer("a\0b", b"")


# ------------------------------------------------------------ the launcher

LAUNCH_ENV = {"PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO), "PYTHONUNBUFFERED": "1"}
FAKE_REMOTE = ["-H", "a:1,b:1", "--ssh-command", "sh -c {command}"]


def _launch(args, script, extra_env=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "HOROVODLIKE_", "OMPI_COMM_WORLD", "PMI"))}
    env.update(LAUNCH_ENV, HOROVODLIKE_STORE_HOST="127.0.0.1", **(extra_env or {}))
    return subprocess.Popen([PYTHON, "-m", "horovodlike.runner", *args, PYTHON, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _lines_until(proc, count, needle, deadline):
    got = []
    while len(got) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if needle in line:
            got.append(line.strip())
    return got


def _cmdlines():
    out = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError:
            pass
    return out


SHOW_KEY_AND_WAIT = rank_program("security_show_key_and_wait")


@pytest.mark.parametrize("hosts", [[], FAKE_REMOTE], ids=["local", "remote"])
def test_the_key_is_on_no_command_line(hosts):
    proc = _launch(["-np", "2", *hosts], SHOW_KEY_AND_WAIT)
    try:
        lines = _lines_until(proc, 2, "KEY", time.monotonic() + 60)
        assert len(lines) == 2, lines
        keys = {line.split()[1] for line in lines}
        assert len(keys) == 1
        key = keys.pop()
        assert len(bytes.fromhex(key)) == jobkey.KEY_BYTES
        assert not [c for c in _cmdlines() if key.encode() in c]
    finally:
        kill_tree(proc)
        proc.wait()


@pytest.mark.parametrize("hosts", [[], FAKE_REMOTE], ids=["local", "remote"])
def test_killing_the_launcher_ends_every_rank(hosts):
    proc = _launch(["-np", "2", *hosts], SHOW_KEY_AND_WAIT)
    pids = []
    try:
        lines = _lines_until(proc, 2, "KEY", time.monotonic() + 60)
        pids = [int(line.split()[2]) for line in lines]
        assert len(pids) == 2, lines
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "ranks outlived their launcher"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        kill_tree(proc)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------- memory and handles

INTERRUPTED = rank_program("security_interrupted")


def test_an_interrupted_wait_keeps_the_buffers_and_the_handle(tmp_path):
    proc = _launch(["-np", "2"], INTERRUPTED, {"HVDTEST_DIR": str(tmp_path)})
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, out
    assert "[0]<stdout>:INTERRUPTED" in out, out
    for r in (0, 1):
        assert f"[{r}]<stdout>:RESULT {r} 3.0 3.0" in out, out
        assert f"[{r}]<stdout>:AFTER {r} 2.0" in out, out


SINGLE = rank_program("security_single")


def test_handles_byte_order_and_names():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "HOROVODLIKE_", "OMPI_COMM_WORLD", "PMI"))}
    env.update(LAUNCH_ENV)
    res = subprocess.run([PYTHON, str(SINGLE)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "STALE-REFUSED" in out and "STALE-ANSWERED" not in out, out
    assert "FRESH [7.0, 7.0, 7.0]" in out, out
    assert "BYTEORDER" in out and ">f4" in out, out
    assert "NAME-REFUSED 'a\\x00b'" in out and "NUL" in out, out
    assert "NAME-OK 'a'" in out, out


# ------------------------------------------------- two real hosts (network namespaces)

ON_THE_LINK = rank_program("security_on_the_link")


@pytest.mark.timeout(180)
def test_two_hosts_with_two_ranks_each_connect_on_their_link_addresses():
    """Two network namespaces are two hosts, two ranks each. A multi-host rank listens
    on its host's link address only, so the two ranks of a host must reach each other
    there too (dialling loopback found nobody, and no such job could start)."""
    sys.path.insert(0, str(REPO / "bench"))
    import netns
    why = netns.available()
    if why:
        pytest.skip(why)
    with netns.TwoNodes() as net:
        subnet = net.subnet
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HOROVOD_", "HOROVODLIKE_", "OMPI_COMM_WORLD", "PMI"))}
        env.update(LAUNCH_ENV, **net.env())
        proc = subprocess.Popen([PYTHON, "-m", "horovodlike.runner", "-np", "4",
                                 *net.launcher_args(2), PYTHON, str(ON_THE_LINK)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=120)
        finally:
            kill_tree(proc)
            proc.wait()
    assert proc.returncode == 0, out
    results = [line.split("RESULT ", 1)[1] for line in out.splitlines() if "RESULT" in line]
    assert len(results) == 4, out
    for line in results:
        assert "[6.0, 6.0, 6.0]" in line, line
        addresses = line.split("] ", 1)[1]
        assert subnet in addresses and "127.0.0.1" not in addresses, line

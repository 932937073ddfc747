"""Rendezvous key-value store shared by the launcher and the ranks.

The launcher runs a :class:`StoreServer`; every rank connects a :class:`StoreClient` to
the address it finds in ``HOROVODLIKE_STORE_ADDR`` and exchanges bootstrap data
(addresses, ids) with its peers. Values are opaque bytes; nothing here is unpickled.

Every connection is authenticated with the job's key before anything else is read
(see ``jobkey``), mutually, so a rank also knows it talks to its own launcher::

    server -> client:  MAGIC(4) version(1) server_nonce(32)
    client -> server:  MAGIC(4) client_nonce(32) mac(key, "client", sn, cn)(32)
    server -> client:  mac(key, "server", sn, cn)(32)

Then one request and one response per round trip (big endian), each carrying an HMAC
under the session key mac(key, "session", sn, cn) over its sequence number and bytes,
so a frame cannot be forged, altered or replayed::

    request:  MAGIC(4) op(1) key_len(u32) value_len(u64) key value mac(32)
    response: MAGIC(4) status(1) value_len(u64) value mac(32)

Lengths are bounded before anything is buffered: keys to 4 KiB, values to
HOROVODLIKE_STORE_MAX_VALUE_BYTES (16 MiB), the whole store (keys and values) to 16
times that. A peer that fails the handshake, sends a bad frame or a bad MAC is dropped
without a reply; the handshake as a whole must finish within HANDSHAKE_SECONDS.
"""

import math
import os
import socket
import socketserver
import struct
import threading
import time

from . import jobkey

__all__ = ["StoreServer", "StoreClient", "StoreAuthError"]

MAGIC = b"HVLS"
VERSION = 2
NONCE = 32
MAC = 32
_HELLO = struct.Struct(">4sB32s")
_REQ = struct.Struct(">4sBIQ")
_RESP = struct.Struct(">4sBQ")

OP_SET, OP_GET, OP_ADD = 1, 2, 3
ST_OK, ST_TIMEOUT, ST_ERROR = 0, 1, 2

MAX_KEY_LEN = 4096
MAX_VALUE_LEN = int(os.environ.get("HOROVODLIKE_STORE_MAX_VALUE_BYTES", 16 << 20))
MAX_TOTAL = 16 * MAX_VALUE_LEN
MAX_CONNECTIONS = 1024
LISTEN_BACKLOG = 1024
MAX_REPORTS = 10
# An unauthenticated peer gets this long to finish the handshake.
HANDSHAKE_SECONDS = 5.0
# The longest GET wait a client may ask for (a day).
MAX_WAIT = 86400.0
_CHUNK = 1 << 20
# Slack added to the socket timeout of a GET so that the server's own
# timeout answer wins the race and the connection stays usable.
_IO_SLACK = 5.0


class StoreAuthError(ConnectionError):
    """The other end does not know the job's key (or is not a horovodlike store)."""


class _ProtocolError(Exception):
    pass


def _recv_exact(sock, n, deadline=None):
    """Read exactly n bytes; None on a clean EOF before the first byte. With a deadline
    (time.monotonic()), the whole read must finish by then (socket.timeout otherwise),
    however the peer spaces its bytes out."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            sock.settimeout(left)
        # Chunked reads: a length is only trusted up to the caps checked before.
        chunk = sock.recv(min(n - got, _CHUNK))
        if not chunk:
            if got == 0:
                return None
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv_part(sock, n):
    """Read the rest of a frame: an EOF here is a peer that went away mid-frame (killed,
    or closed), never an empty field."""
    data = _recv_exact(sock, n)
    if data is None:
        raise ConnectionError("connection closed mid-frame")
    return data


def _split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"store address must be host:port, got {addr!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_key(key):
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise ValueError("the store needs the job key (at least 16 bytes)")
    return bytes(key)


class _Session:
    """The MACs of one authenticated connection; seq counts frames in each direction."""

    def __init__(self, key, sn, cn):
        self.key = jobkey.mac(key, b"session", sn, cn)
        self.seq = 0

    def request_mac(self, header, key, value):
        return jobkey.mac(self.key, b"req", self.seq.to_bytes(8, "big"), header, key, value)

    def response_mac(self, header, value):
        return jobkey.mac(self.key, b"resp", self.seq.to_bytes(8, "big"), header, value)


class _Handler(socketserver.BaseRequestHandler):
    """Serves one client connection until it closes."""

    def setup(self):
        self.server.track(self.request, add=True)

    def finish(self):
        self.server.track(self.request, add=False)

    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            session = self._handshake(sock)
            sock.settimeout(None)
            while True:
                header = _recv_exact(sock, _REQ.size)
                if header is None:
                    return
                magic, op, key_len, value_len = _REQ.unpack(header)
                if magic != MAGIC or key_len > MAX_KEY_LEN or value_len > MAX_VALUE_LEN:
                    raise _ProtocolError("bad frame")
                raw_key = _recv_part(sock, key_len)
                value = _recv_part(sock, value_len)
                got = _recv_part(sock, MAC)
                if not jobkey.check(session.request_mac(header, raw_key, value), got):
                    raise _ProtocolError("bad MAC")
                status, payload = self.server.dispatch(op, raw_key.decode("utf-8"), value)
                head = _RESP.pack(MAGIC, status, len(payload))
                sock.sendall(head + payload + session.response_mac(head, payload))
                session.seq += 1
        except (_ProtocolError, UnicodeDecodeError) as e:
            # Dropping the connection is the rejection; the server and the other
            # clients are unaffected. Whoever runs the store hears about it.
            self.server.store.rejected(self.client_address, str(e) or "bad key")
        except (ConnectionError, OSError):
            return

    def _handshake(self, sock):
        key = self.server.store.key
        sn = os.urandom(NONCE)
        # One deadline for the whole handshake, not one per recv: a peer that trickles a
        # byte now and then must not hold a connection slot for longer than this.
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        sock.settimeout(HANDSHAKE_SECONDS)
        sock.sendall(_HELLO.pack(MAGIC, VERSION, sn))
        try:
            reply = _recv_exact(sock, 4 + NONCE + MAC, deadline)
        except socket.timeout:
            raise _ProtocolError(f"no handshake within {HANDSHAKE_SECONDS:g} s") from None
        except ConnectionError:
            # A client killed mid-handshake (the launcher ending the job) or a scanner
            # that gave up: it got nothing, and there is nothing to report.
            raise ConnectionError("closed during the handshake") from None
        if reply is None or reply[:4] != MAGIC:
            raise _ProtocolError("not a store client")
        cn, proof = reply[4:4 + NONCE], reply[4 + NONCE:]
        if not jobkey.check(jobkey.mac(key, b"client", sn, cn), proof):
            raise _ProtocolError("client does not know the job key")
        sock.sendall(jobkey.mac(key, b"server", sn, cn))
        return _Session(key, sn, cn)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every rank of a large job connects at once; socketserver's default backlog of 5
    # would leave most of them retrying SYNs (the kernel caps it at somaxconn).
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address, store):
        self.store = store
        self._conns = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def verify_request(self, request, client_address):
        # Bounded threads: a flood of connections is refused, not served.
        with self._conns_lock:
            return len(self._conns) < MAX_CONNECTIONS

    def track(self, sock, add):
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(sock)

    def drop_connections(self):
        # Handler threads block in recv(); shutting the sockets down is the
        # only way to wake them when the store closes.
        with self._conns_lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def dispatch(self, op, key, value):
        return self.store._dispatch(op, key, value)


class StoreServer:
    """Threaded TCP key-value store; bind happens at construction. key: the job key."""

    def __init__(self, host="127.0.0.1", port=0, key=None, on_reject=None):
        """on_reject(message) hears about connections dropped for failing the
        handshake or sending a bad frame (at most MAX_REPORTS of them)."""
        self.key = _check_key(key)
        self._on_reject, self._reports = on_reject, 0
        self._data = {}
        self._bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = None
        self._server = _TCPServer((host, port), self)

    @property
    def host(self):
        return self._server.server_address[0]

    @property
    def port(self):
        return self._server.server_address[1]

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                name="horovodlike-store", daemon=True)
            self._thread.start()
        return self

    def close(self):
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        # shutdown() waits for serve_forever, so only call it if it runs.
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        self._server.drop_connections()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def rejected(self, peer, why):
        with self._cond:
            self._reports += 1
            n = self._reports
        if self._on_reject is not None and n <= MAX_REPORTS:
            more = " (further rejections are not reported)" if n == MAX_REPORTS else ""
            self._on_reject(f"store: dropped a connection from {peer[0]}:{peer[1]}: "
                            f"{why}{more}")

    def _dispatch(self, op, key, value):
        if op == OP_SET:
            with self._cond:
                grow = self._size(key, value) - self._size(key, self._data.get(key))
                if self._bytes + grow > MAX_TOTAL:
                    return ST_ERROR, (f"store is full ({self._bytes} bytes held, "
                                      f"limit {MAX_TOTAL})").encode()
                self._data[key] = value
                self._bytes += grow
                self._cond.notify_all()
            return ST_OK, b""
        if op == OP_GET and len(value) == 8:
            timeout = struct.unpack(">d", value)[0]
            if not (math.isfinite(timeout) and 0 <= timeout <= MAX_WAIT):
                return ST_ERROR, f"GET timeout must be 0..{MAX_WAIT:g} s, got {timeout}".encode()
            return self._wait_get(key, timeout)
        if op == OP_ADD and len(value) == 8:
            try:
                return ST_OK, struct.pack(">q", self._add(key, value))
            except MemoryError as e:
                return ST_ERROR, str(e).encode()
            except ValueError:
                return ST_ERROR, f"key {key!r} is not a counter".encode()
        return ST_ERROR, b"unknown operation"

    @staticmethod
    def _size(key, value):
        """What an entry costs against MAX_TOTAL: its key's bytes too, so that many
        keys with empty values cannot fill memory past the cap (0 for no entry)."""
        return 0 if value is None else len(key.encode("utf-8")) + len(value)

    def _wait_get(self, key, timeout):
        with self._cond:
            ready = self._cond.wait_for(lambda: key in self._data or self._closed, timeout)
            if key in self._data:
                return ST_OK, self._data[key]
            if ready:
                return ST_ERROR, b"store is closing"
            return ST_TIMEOUT, b""

    def _add(self, key, raw_delta):
        delta = struct.unpack(">q", raw_delta)[0]
        with self._cond:
            # Counters are stored as decimal text so get() on them is readable.
            held = self._data.get(key)
            current = int(held or b"0")
            if not -(1 << 63) <= current + delta < (1 << 63):
                raise ValueError("counter overflow")
            new = str(current + delta).encode()
            grow = self._size(key, new) - self._size(key, held)
            if self._bytes + grow > MAX_TOTAL:
                raise MemoryError(f"store is full ({self._bytes} bytes held, limit {MAX_TOTAL})")
            self._data[key] = new
            self._bytes += grow
            self._cond.notify_all()
            return current + delta


def _connect(host, port, timeout):
    """Connect, retrying: ranks may come up before the server is reachable."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(
                0.1, min(5.0, deadline - time.monotonic())))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            if time.monotonic() + delay > deadline:
                raise TimeoutError(
                    f"could not connect to store at {host}:{port} within "
                    f"{timeout:g}s: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class StoreClient:
    """Blocking client; one request in flight at a time (internally locked).

    key: the job key; None reads it from the environment horovodlikerun set."""

    def __init__(self, addr, timeout=60.0, key=None):
        if key is None:
            key = jobkey.from_env()
            if key is None:
                raise ValueError(f"no job key for store {addr}: {jobkey.ENV} is not set "
                                 f"(was this process started by horovodlikerun?)")
        self.address = addr
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock = _connect(*_split_addr(addr), timeout)
        try:
            self._session = self._handshake(_check_key(key))
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, key):
        self._sock.settimeout(max(HANDSHAKE_SECONDS, min(self.timeout, 60.0)))
        try:
            hello = _recv_exact(self._sock, _HELLO.size)
            if hello is None:
                raise StoreAuthError(f"store {self.address} closed the connection at hello")
            magic, version, sn = _HELLO.unpack(hello)
            if magic != MAGIC or version != VERSION:
                raise StoreAuthError(f"{self.address} is not a horovodlike store of this "
                                     f"version (magic {magic!r}, version {version})")
            cn = os.urandom(NONCE)
            self._sock.sendall(MAGIC + cn + jobkey.mac(key, b"client", sn, cn))
            proof = _recv_exact(self._sock, MAC)
            if proof is None:
                raise StoreAuthError(f"store {self.address} refused this job's key")
            if not jobkey.check(jobkey.mac(key, b"server", sn, cn), proof):
                raise StoreAuthError(f"store {self.address} does not know this job's key")
        except socket.timeout:
            raise StoreAuthError(f"store {self.address} did not finish the handshake") from None
        return _Session(key, sn, cn)

    def set(self, key, value):
        value = bytes(value)
        if len(value) > MAX_VALUE_LEN:
            raise ValueError(f"store value for {key!r} is {len(value)} bytes; the limit is "
                             f"{MAX_VALUE_LEN} (HOROVODLIKE_STORE_MAX_VALUE_BYTES)")
        self._call(OP_SET, key, value, self.timeout)

    def get(self, key, timeout=None):
        """Block until `key` exists; `timeout` None means the client default."""
        wait = self.timeout if timeout is None else float(timeout)
        if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT):
            raise ValueError(f"store get: timeout must be between 0 and {MAX_WAIT:g} s, "
                             f"got {wait}")
        status, payload = self._call(
            OP_GET, key, struct.pack(">d", wait), wait + _IO_SLACK)
        if status == ST_TIMEOUT:
            raise TimeoutError(self._timeout_msg(key, wait))
        return payload

    def add(self, key, delta=1):
        """Atomically add to an integer counter and return the new value."""
        _, payload = self._call(OP_ADD, key, struct.pack(">q", delta),
                                self.timeout)
        return struct.unpack(">q", payload)[0]

    def close(self):
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _timeout_msg(self, key, wait):
        return (f"timed out after {wait:g}s waiting for key {key!r} "
                f"in store {self.address}")

    def _call(self, op, key, value, io_timeout):
        raw_key = key.encode("utf-8")
        if len(raw_key) > MAX_KEY_LEN:
            raise ValueError(f"store key is {len(raw_key)} bytes; the limit is {MAX_KEY_LEN}")
        header = _REQ.pack(MAGIC, op, len(raw_key), len(value))
        with self._lock:
            if self._sock is None:
                raise ConnectionError(f"store client for {self.address} is closed")
            s = self._session
            try:
                self._sock.settimeout(io_timeout)
                # One send: a client killed mid-request leaves a short frame, which the
                # server reads as a peer gone, not as a forgery.
                self._sock.sendall(header + raw_key + value +
                                   s.request_mac(header, raw_key, value))
                status, payload = self._read_response()
                s.seq += 1
            except socket.timeout as exc:
                # A late response would desynchronise the stream: give up on it.
                self._sock.close()
                self._sock = None
                raise TimeoutError(self._timeout_msg(key, io_timeout)) from exc
        if status == ST_ERROR:
            raise RuntimeError(f"store {self.address}: {payload.decode(errors='replace')}")
        return status, payload

    def _read_response(self):
        header = _recv_exact(self._sock, _RESP.size)
        if header is None:
            raise ConnectionError(f"store {self.address} closed the connection")
        magic, status, length = _RESP.unpack(header)
        if magic != MAGIC or length > MAX_VALUE_LEN:
            raise ConnectionError(f"store {self.address} sent a malformed reply")
        payload = _recv_part(self._sock, length)
        got = _recv_part(self._sock, MAC)
        if not jobkey.check(self._session.response_mac(header, payload), got):
            raise StoreAuthError(f"store {self.address} sent a reply with a bad MAC")
        return status, payload

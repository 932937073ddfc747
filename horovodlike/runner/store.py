"""Rendezvous key-value store shared by the launcher and the ranks.

The launcher runs a :class:`StoreServer`; every rank connects a
:class:`StoreClient` to the address it finds in ``HOROVODLIKE_STORE_ADDR``
and uses it to exchange bootstrap data (addresses, ids) with its peers.

Wire format (big endian), one request then one response per round trip::

    request:  MAGIC(4) op(1) key_len(u32) value_len(u64) key value
    response: MAGIC(4) status(1) value_len(u64) value

The magic exists so that a stray connection (a port scanner, a
misconfigured peer) is dropped instead of being parsed as a huge frame.
"""

import socket
import socketserver
import struct
import threading
import time

__all__ = ["StoreServer", "StoreClient"]

MAGIC = b"HVLS"
_REQ = struct.Struct(">4sBIQ")
_RESP = struct.Struct(">4sBQ")

OP_SET, OP_GET, OP_ADD = 1, 2, 3
ST_OK, ST_TIMEOUT, ST_ERROR = 0, 1, 2

# Real keys are short; a larger length means the peer is not speaking our
# protocol even if the magic happened to match.
_MAX_KEY_LEN = 64 * 1024
_CHUNK = 1 << 20
# Slack added to the socket timeout of a GET so that the server's own
# timeout answer wins the race and the connection stays usable.
_IO_SLACK = 5.0


class _ProtocolError(Exception):
    pass


def _recv_exact(sock, n):
    """Read exactly n bytes; None on a clean EOF before the first byte."""
    chunks, got = [], 0
    while got < n:
        # Chunked reads so a bogus length cannot make us allocate it upfront.
        chunk = sock.recv(min(n - got, _CHUNK))
        if not chunk:
            if got == 0:
                return None
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"store address must be host:port, got {addr!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


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
            while True:
                header = _recv_exact(sock, _REQ.size)
                if header is None:
                    return
                magic, op, key_len, value_len = _REQ.unpack(header)
                if magic != MAGIC or key_len > _MAX_KEY_LEN:
                    raise _ProtocolError("bad frame")
                key = (_recv_exact(sock, key_len) or b"").decode("utf-8")
                value = _recv_exact(sock, value_len) or b""
                status, payload = self.server.dispatch(op, key, value)
                sock.sendall(_RESP.pack(MAGIC, status, len(payload)) + payload)
        except (_ProtocolError, UnicodeDecodeError, ConnectionError, OSError):
            # Dropping the connection is the rejection; the server and the
            # other clients are unaffected.
            return


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, store):
        self.store = store
        self._conns = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

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
    """Threaded TCP key-value store; bind happens at construction."""

    def __init__(self, host="127.0.0.1", port=0):
        self._data = {}
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

    def _dispatch(self, op, key, value):
        if op == OP_SET:
            with self._cond:
                self._data[key] = value
                self._cond.notify_all()
            return ST_OK, b""
        if op == OP_GET and len(value) == 8:
            return self._wait_get(key, struct.unpack(">d", value)[0])
        if op == OP_ADD and len(value) == 8:
            try:
                return ST_OK, struct.pack(">q", self._add(key, value))
            except ValueError:
                return ST_ERROR, f"key {key!r} is not a counter".encode()
        return ST_ERROR, b"unknown operation"

    def _wait_get(self, key, timeout):
        with self._cond:
            ready = self._cond.wait_for(
                lambda: key in self._data or self._closed,
                timeout=None if timeout < 0 else timeout)
            if key in self._data:
                return ST_OK, self._data[key]
            if ready:
                return ST_ERROR, b"store is closing"
            return ST_TIMEOUT, b""

    def _add(self, key, raw_delta):
        delta = struct.unpack(">q", raw_delta)[0]
        with self._cond:
            # Counters are stored as decimal text so get() on them is readable.
            current = int(self._data.get(key, b"0") or b"0")
            self._data[key] = str(current + delta).encode()
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
    """Blocking client; one request in flight at a time (internally locked)."""

    def __init__(self, addr, timeout=60.0):
        self.address = addr
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock = _connect(*_split_addr(addr), timeout)

    def set(self, key, value):
        self._call(OP_SET, key, bytes(value), self.timeout)

    def get(self, key, timeout=None):
        """Block until `key` exists; `timeout` None means the client default."""
        wait = self.timeout if timeout is None else timeout
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
        frame = _REQ.pack(MAGIC, op, len(raw_key), len(value)) + raw_key
        with self._lock:
            if self._sock is None:
                raise ConnectionError(f"store client for {self.address} is closed")
            try:
                self._sock.settimeout(io_timeout)
                self._sock.sendall(frame)
                self._sock.sendall(value)
                status, payload = self._read_response()
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
        if magic != MAGIC:
            raise ConnectionError(f"store {self.address} sent a malformed reply")
        return status, _recv_exact(self._sock, length) or b""

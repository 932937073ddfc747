"""The job's secret: made once per job, known to every rank, never sent over a port.

horovodlikerun makes 32 random bytes per job and hands them to local ranks in the
environment (HOROVODLIKE_JOB_KEY, hex; /proc/<pid>/environ is readable only by the
job's own user) and to remote ranks on ssh's stdin, never on a command line. Under
mpirun or srun, rank 0 makes the key and MPI broadcasts it.

Every store connection and every engine connection proves knowledge of the key with
HMAC-SHA256 over fresh random challenges from both sides, so the key itself never
crosses the wire and a recorded exchange cannot be replayed.
"""
import hashlib
import hmac
import os

from . import launch_contract

KEY_BYTES = 32
ENV = launch_contract.JOB_KEY


def generate() -> bytes:
    return os.urandom(KEY_BYTES)


def to_hex(key: bytes) -> str:
    return key.hex()


def from_hex(text: str, where: str = ENV) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{where} is not a hex string") from None
    if not 16 <= len(key) <= 64:
        raise ValueError(f"{where} holds {len(key)} bytes; a job key is 16 to 64 bytes")
    return key


def from_env():
    """The key horovodlikerun gave this process, or None when it gave none."""
    text = os.environ.get(ENV)
    return from_hex(text) if text else None


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the parts, each length-prefixed so no two splits collide."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.digest()


def check(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)

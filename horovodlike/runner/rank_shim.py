"""The small process horovodlikerun puts between itself and every rank.

    python -m horovodlike.runner.rank_shim COMMAND [ARGS...]

It does two things a bare rank cannot:
  * it reads the job's key from the first line of its stdin and gives it to the rank
    in its environment, so the key is never on a command line (`ps` shows those to
    every user) and can travel through ssh's stdin to a remote host;
  * it ties the rank's life to the launcher's. The launcher keeps the other end of
    stdin open for the whole job; when the launcher dies, even by SIGKILL, the pipe (or
    the ssh connection carrying it) closes, the shim reads EOF and kills the rank's
    process group. The rank also gets PR_SET_PDEATHSIG, so it dies with the shim.

The rank stays in the shim's process group, so the launcher's killpg() reaches both.
The shim exits with the rank's status (a signal death is re-raised on itself, so the
launcher names the signal).
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading

from ..common import jobkey

GRACE_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prepare_child(shim_pid):
    # Runs in the child between fork and exec. The shim has no other thread yet when
    # it spawns, so calling into libc here is safe.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != shim_pid:   # the shim died before prctl took effect
        os._exit(1)
    # An ignored signal stays ignored across exec; the rank gets the defaults back.
    for sig in _FORWARDED:
        signal.signal(sig, signal.SIG_DFL)


def _watch_launcher(child):
    """Block until the launcher's end of stdin closes, then end the rank."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    if child.poll() is None:
        try:   # our stderr most likely went away with the launcher
            sys.stderr.write("horovodlike: the launcher went away; ending this rank\n")
            sys.stderr.flush()
        except OSError:
            pass
        try:
            child.terminate()
            child.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()


def _read_key_line():
    line = b""
    while not line.endswith(b"\n"):
        c = os.read(0, 1)   # byte by byte: nothing after the line may be consumed
        if not c:
            break
        line += c
        if len(line) > 256:
            break
    return line.decode("ascii", "replace").strip()


def main(argv):
    if not argv:
        sys.stderr.write("usage: python -m horovodlike.runner.rank_shim COMMAND...\n")
        return 2
    key = _read_key_line()
    try:
        jobkey.from_hex(key, "the key line on stdin")
    except ValueError as e:
        sys.stderr.write(f"horovodlike rank_shim: {e}\n")
        return 2
    env = dict(os.environ, **{jobkey.ENV: key})
    # The launcher's signals reach the rank through the process group; the shim itself
    # only waits for it.
    for sig in _FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    shim_pid = os.getpid()
    try:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 preexec_fn=lambda: _prepare_child(shim_pid))
    except OSError as e:
        sys.stderr.write(f"horovodlike: cannot start {argv[0]!r}: {e}\n")
        return 127
    threading.Thread(target=_watch_launcher, args=(child,), daemon=True).start()
    code = child.wait()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``horovodlikerun``: start N ranks on one or more hosts, Horovod style.

The launcher owns the job: it runs the rendezvous store, spawns every rank
in its own process group, relays their output with ``[rank]<stream>:``
prefixes, forwards SIGINT/SIGTERM, and tears the whole job down as soon as
one rank fails so that a crash never leaves peers hanging in a collective (a rank killed
by a signal: once the others have logged their engines' verdict naming it, at most
VERDICT_SECONDS later). Once a rank
has finished, a rank that stays stopped or silent for ``--shutdown-grace`` seconds is
killed and named: with its peers' engines gone, nobody else would notice it.

The elastic driver (elastic_driver.py) starts its workers with the same pieces, all
public here: the host list (parse_hosts, parse_host_entry, is_local_host, RankSlot), a
rank's environment and command (rank_env, shim_argv, remote_argv), the store's address
(store_bind_and_advertise), the running processes (Job, Activity, Output,
install_signal_handlers, GRACE_SECONDS) and the job's variables (tuning_env).
"""

import argparse
import errno
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..common import jobkey
from ..common import launch_contract as contract
from ..common.store import StoreServer
from . import args as cli
from . import exits
from .blame import Blame
from .job_env import exportable, job_env
from .rank_output import RankOutput

PROG = cli.PROG
DEFAULT_SSH_COMMAND = (
    "ssh -o BatchMode=yes -o StrictHostKeyChecking=no {host} {command}")
GRACE_SECONDS = 5.0
# How long the others may take to name a rank killed by a signal before they are stopped
# (Job._await_verdicts): the engine's worker waits up to 1 s for rank 0's verdict
# (engine/core/fail.c), plus 3 s for a loaded host (with 1 s, a test job of 3 ranks on 2
# loaded cores could be stopped before its worker had named the culprit). It is waited in
# full only when a rank never logs its engine's failure (it is stopped, or has no engine).
VERDICT_SECONDS = 4.0
_LOCAL_NAMES = ("localhost", "127.0.0.1")
_READ_LIMIT = 64 * 1024


@dataclass(frozen=True)
class RankSlot:
    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} -np N [-H host1:n,host2:n | -hostfile FILE] [options] command ...",
        description="Launch a horovodlike data-parallel job. Takes horovodrun's "
                    "command line.")
    cli.add_arguments(p)
    p.add_argument("--ssh-command", default=os.environ.get(
        contract.SSH_COMMAND, DEFAULT_SSH_COMMAND),
        help="template used to start a rank on a remote host; "
             "{host} and {command} are substituted")
    # REMAINDER keeps the user's own flags (even ones that look like ours).
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="command to run on every rank")
    return p


def parse_args(argv):
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(cli.unrecognized(parser, unknown))
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    cli.finish(parser, args)
    if not args.command:
        parser.error("no command given to run")
    hint = cli.missing_python(args.command, argv)
    if hint:
        parser.error(hint)
    try:
        args.host_list = parse_hosts(args.hosts or f"localhost:{args.num_proc}")
        cli.check_nics(args.nics, all(is_local_host(h) for h, _ in args.host_list))
    except ValueError as exc:
        parser.error(str(exc))
    return args


MAX_SLOTS_PER_HOST = 4096     # more ranks than any one host could run


def parse_host_entry(item):
    """(host, slots) from 'host:slots' (or 'host': one slot); ValueError naming it.
    Slots are ASCII digits, 1..MAX_SLOTS_PER_HOST."""
    name, sep, slots = item.rpartition(":")
    if not sep:
        name, slots = item, "1"
    if name and 0 < len(slots) <= 9 and slots.isascii() and slots.isdigit():
        n = int(slots)
        if 1 <= n <= MAX_SLOTS_PER_HOST:
            return name, n
    raise ValueError(f"bad host entry {item!r} (want host:slots, slots a whole number "
                     f"from 1 to {MAX_SLOTS_PER_HOST})")


def parse_hosts(spec):
    """[(host, slots)] from 'host1:n,host2:m'."""
    hosts = [parse_host_entry(item) for item in filter(None, (s.strip() for s in spec.split(",")))]
    if not hosts:
        raise ValueError(f"no hosts in {spec!r}")
    return hosts


def compute_plan(hosts, num_proc):
    """Fill hosts in order; local/cross ranks follow Horovod's definitions."""
    total = sum(slots for _, slots in hosts)
    if total < num_proc:
        raise ValueError(f"-np {num_proc} needs {num_proc} slots but the "
                         f"hosts only provide {total}")
    placed = []  # (host, local_rank, local_size)
    for host, slots in hosts:
        count = min(slots, num_proc - len(placed))
        placed.extend((host, i, count) for i in range(count))
    # Hosts (in order) that own a rank with a given local rank.
    by_local = {}
    for host, local_rank, _ in placed:
        by_local.setdefault(local_rank, []).append(host)
    return [RankSlot(rank, host, lr, ls, by_local[lr].index(host),
                     len(by_local[lr]))
            for rank, (host, lr, ls) in enumerate(placed)]


def is_local_host(host):
    return host in _LOCAL_NAMES or host == socket.gethostname()


def tuning_env(args):
    """Horovod's flags as the env vars the ranks read (see args.job_env)."""
    return job_env(args)


def host_name(slot):
    """The name a rank is known by (what the engine's errors say too)."""
    return socket.gethostname() if slot.host in _LOCAL_NAMES else slot.host


def rank_env(slot, size, job_env):
    host = host_name(slot)
    env = dict(job_env)
    env.update(contract.rank_vars(slot.rank, size, slot.local_rank, slot.local_size,
                                  slot.cross_rank, slot.cross_size, host))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def remote_argv(template, host, cwd, env, command):
    """argv that starts `command` on `host` through the ssh-like template.

    A ``{command}`` that is a whole template word becomes a single argv
    element holding the shell line (what ssh and ``sh -c`` expect); when it
    is embedded in a larger word it is already inside shell text, so it is
    quoted once more.
    """
    exported = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
                        if exportable(k))
    line = (f"cd {shlex.quote(cwd)} && env {exported} "
            + " ".join(shlex.quote(c) for c in command))
    argv = []
    for word in shlex.split(template):
        if word == "{command}":
            argv.append(line)
        else:
            argv.append(word.replace("{host}", host)
                        .replace("{command}", shlex.quote(line)))
    return argv


def store_bind_and_advertise(plan):
    """Loopback-only when every rank is local; otherwise reachable from peers.

    Multi-host: the interface HOROVOD_GLOO_IFACE names, else the advertised address
    when it is one of ours; every interface only when neither is known (the store
    authenticates every connection with the job key either way)."""
    if all(is_local_host(s.host) for s in plan):
        return "127.0.0.1", "127.0.0.1"
    iface = contract.iface()
    if iface:
        from ..common.bootstrap import iface_address
        addr = iface_address(iface)
        return addr, os.environ.get(contract.STORE_HOST) or addr
    advertised = os.environ.get(contract.STORE_HOST)
    if not advertised:
        try:
            advertised = socket.gethostbyname(socket.gethostname())
        except OSError:
            advertised = socket.gethostname()
    return ("0.0.0.0" if advertised.startswith("127.") or not _is_own_address(advertised)
            else advertised), advertised


def _is_own_address(addr):
    try:
        with socket.socket() as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def describe_exit(slot, code):
    """(the launcher's line about a rank that ended with wait status `code`, the
    launcher's exit status)."""
    return (f"rank {slot.rank} (host {host_name(slot)}) {exits.exit_text(code)}",
            exits.exit_status(code))


class Output:
    """The launcher's output: serialises prefixed lines from many reader threads onto
    our streams (pump), and says the launcher's own lines (say)."""

    def __init__(self, lines=None):
        self._lock = threading.Lock()
        self.lines = lines or RankOutput()  # line format and per-rank copies

    def write(self, stream, text):
        data = text.encode("utf-8", "replace")
        with self._lock:
            try:
                stream.flush()
                buf = getattr(stream, "buffer", None)
                if buf is not None:
                    buf.write(data)
                    buf.flush()
                else:
                    stream.write(text)
                    stream.flush()
            except (BrokenPipeError, ValueError):
                pass  # our reader went away; keep draining the ranks

    def say(self, message):
        self.write(sys.stderr, f"{PROG}: {message}\n")

    def pump(self, rank, name, pipe, stream, observe=None):
        with pipe, self.lines.open(rank, name) as copy:
            for raw in iter(lambda: pipe.readline(_READ_LIMIT), b""):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                if observe is not None:
                    observe(rank, line)
                text = self.lines.line(rank, name, line.decode("utf-8", "replace"))
                self.write(stream, text)
                if copy is not None:
                    copy.write(text)


# How the engine names a rank it lost (engine/core/fail.c, hvdl__peer_lost). The rank that
# stopped may never exit itself (SIGSTOP, a hang), so the launcher learns the culprit
# from the survivors' words rather than from who exited first.
# A rank that never reached init is "late" (common/bootstrap.py).
_LOST = re.compile(rb"rank (\d+) (?:\(host [^)]*\) was lost|(is late))")
# The engine's line when it has failed (engine/core/log.c; fail.c logs every cause).
_VERDICT = re.compile(rb"^\[horovodlike rank \d+\] ERROR: ")


def group_activity(pgid):
    """(CPU ticks used, any process stopped) over a process group on this host, read
    from /proc: one pass over the process table, O(processes)."""
    ticks, stopped = 0, False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue          # gone meanwhile
        if int(fields[2]) != pgid:
            continue
        ticks += int(fields[11]) + int(fields[12])        # utime + stime
        stopped = stopped or fields[0] in (b"T", b"t")
    return ticks, stopped


class Activity:
    """How long each rank has done nothing: no output line, and no CPU time in its
    process group on this host (for a rank on another host, that is its ssh client's,
    so it is judged by its output). A rank quiet for long is stopped or hung."""

    def __init__(self, job):
        self.job = job
        self.cpu = {}                      # rank -> (ticks, when they last changed)

    def quiet(self, rank, since, now):
        """(seconds quiet, counted from `since` at the earliest; any process stopped)."""
        ticks, stopped = group_activity(self.job.procs[rank].pid)
        seen, when = self.cpu.get(rank, (None, since))
        if seen is not None and ticks != seen:
            when = now
        self.cpu[rank] = (ticks, when)
        return now - max(since, when, self.job.last_output.get(rank, 0.0)), stopped

    def forget(self, rank):
        self.cpu.pop(rank, None)


class _Finishing:
    """Once the job is finishing (a rank exited 0), a rank still running that stays
    quiet for the shutdown grace is stopped or hung: it would keep the launcher waiting
    for ever, since no engine is left to name it."""

    def __init__(self, job, grace):
        self.grace = grace
        self.activity = Activity(job)
        self.since = None                  # when the job began finishing

    def begin(self, now):
        if self.since is None and self.grace is not None:
            self.since = now

    def next_check(self):
        return None if self.since is None else time.monotonic() + min(1.0, self.grace / 4)

    def overdue(self, pending, now):
        """[(rank, 'stopped' or 'silent')] for ranks quiet for the whole grace."""
        out = []
        for rank in sorted(pending):
            quiet, stopped = self.activity.quiet(rank, self.since, now)
            if quiet >= self.grace:
                out.append((rank, "stopped" if stopped else "silent"))
        return out


class Job:
    """The running set of ranks and the policy for ending them."""

    def __init__(self, plan, out, key, shutdown_grace=None):
        self.plan = plan
        self.out = out
        self.key = key
        self.procs = {}
        self.events = queue.SimpleQueue()  # safe to put() from a signal handler
        self.threads = []
        self.pumps = {}                    # rank -> its output threads
        self.lost = None                   # (culprit, reporting rank, "was lost"/"was late"), the first one named
        self.blame = Blame()               # who the ranks' lines name as the cause
        self.cause = None                  # the rank the launcher named as the cause
        self.failed = set()                # ranks that failed by themselves (not ended by us)
        self.last_output = {}              # rank -> when it last printed a line
        self.finishing = _Finishing(self, shutdown_grace)
        self.settled = set()               # ranks that logged their engine's failure, or exited
        self.settled_cv = threading.Condition()

    def spawn(self, slot, argv, env):
        """Start one rank behind its rank_shim. Its stdin carries the job key and then
        stays open: when this process dies, the shim sees EOF and ends the rank."""
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        self.procs[slot.rank] = proc
        try:
            proc.stdin.write(jobkey.to_hex(self.key).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass   # it died at once; _reap reports how
        self.pumps[slot.rank] = [
            self._thread(self.out.pump, slot.rank, "stdout", proc.stdout, sys.stdout,
                         self._observe),
            self._thread(self.out.pump, slot.rank, "stderr", proc.stderr, sys.stderr,
                         self._observe)]
        self._thread(self._reap, slot.rank, proc)

    def _thread(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def _observe(self, rank, line):
        self.last_output[rank] = time.monotonic()
        self.blame.observe(rank, line, self.last_output[rank])
        if _VERDICT.match(line):
            self._settle(rank)
        m = _LOST.search(line) if self.lost is None else None
        if m and int(m.group(1)) in self.procs:
            self.lost = (int(m.group(1)), rank, "was late" if m.group(2) else "was lost")

    def _blame(self, rank, code):
        """The launcher's one line about a failed job: the lost rank when a survivor
        named one, then how `rank` ended."""
        for t in self.pumps.get(rank, ()):
            t.join(timeout=1.0)   # its last lines may name the culprit
        message, exit_code = describe_exit(self.plan[rank], code)
        if self.lost is not None and self.lost[0] != rank:
            culprit, reporter, what = self.lost
        else:
            culprit, reporter, what = self.blame.cause(rank, self.procs)
        self.cause = culprit
        exception = self.blame.exception.get(culprit)
        if culprit == rank:
            return message + (f" after {exception}" if exception else ""), exit_code
        detail = ""
        if exception:     # its own error says more than how the others saw it end
            what, detail = "failed first", f" ({exception})"
        by = f", as rank {reporter} reported" if reporter is not None else ""
        return (f"rank {culprit} (host {host_name(self.plan[culprit])}) {what}{detail}{by}; "
                f"{message}"), exit_code

    def _say_victims(self):
        """After the job: the ranks that failed only because the cause did."""
        if self.cause is None:
            return
        deadline = time.monotonic() + 2.0    # every rank has exited: their pipes end
        for t in [t for ts in self.pumps.values() for t in ts]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))  # last lines may name it
        victims = self.blame.victims(self.cause, self.failed)
        if victims:
            names = ", ".join(str(r) for r in victims)
            cause = self.plan[self.cause]
            self.out.say(f"rank{'s' if len(victims) > 1 else ''} {names} failed as "
                         f"victim{'s' if len(victims) > 1 else ''} of rank {cause.rank} "
                         f"(host {host_name(cause)}): each failed after it, or named it")

    def _reap(self, rank, proc):
        code = proc.wait()
        self._settle(rank)
        self.events.put(("exit", rank, code))

    def _settle(self, rank):
        with self.settled_cv:
            self.settled.add(rank)
            self.settled_cv.notify_all()

    def _await_verdicts(self, pending):
        """A rank killed by a signal told nobody; the others' engines find its
        connections closed and each logs the verdict naming it, within about a second
        (a worker waits up to 1 s for rank 0's). Stopped at once, a rank on a busy host
        may not have said it yet, and the job would end without its naming of the
        culprit. So wait until every running rank has logged its engine's failure or
        exited, at most VERDICT_SECONDS."""
        until = time.monotonic() + VERDICT_SECONDS
        with self.settled_cv:
            while not pending <= self.settled:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.settled_cv.wait(left)

    def on_signal(self, signum, _frame):
        self.events.put(("signal", signum))

    def signal_all(self, sig, only_running=True):
        for proc in self.procs.values():
            if only_running and proc.returncode is not None:
                continue
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self):
        """Block until every rank has exited; return the job's exit code."""
        pending = set(self.procs)
        exit_code, stopping, deadline = 0, False, None
        hang_check = None    # when a rank named as lost must have exited by itself
        quiet_check = None   # when to look again for ranks stopped after the others left
        killed = set()       # ranks ended for being quiet; their exit is already told
        while pending:
            wake = min((t for t in (deadline, hang_check, quiet_check) if t is not None),
                       default=None)
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                now = time.monotonic()
                if quiet_check is not None and now >= quiet_check:
                    quiet_check = None
                    if not stopping:
                        for rank, how in self.finishing.overdue(pending - killed, now):
                            slot = self.plan[rank]
                            self.out.say(f"rank {rank} (host {host_name(slot)}) is {how} and "
                                         f"did not exit within {self.finishing.grace:g} s of "
                                         f"another rank finishing (--shutdown-grace); "
                                         f"killing it")
                            killed.add(rank)
                            exit_code = exit_code or 1
                            self._kill(rank)
                        quiet_check = self.finishing.next_check()
                    continue
                if hang_check is not None and now >= hang_check:
                    hang_check = None
                    if not stopping and self.lost is not None and self.lost[0] in pending:
                        # A survivor finished, but a rank it named as lost has not
                        # exited (it hangs or is stopped): end the job and say so.
                        culprit = self.plan[self.lost[0]]
                        self.out.say(f"rank {culprit.rank} (host {host_name(culprit)}) "
                                     f"{self.lost[2]}, as rank {self.lost[1]} reported; "
                                     f"ending the job")
                        exit_code = 1
                        self.signal_all(signal.SIGTERM)
                        stopping, deadline = True, time.monotonic() + GRACE_SECONDS
                    continue
                if deadline is not None and now >= deadline:
                    self.signal_all(signal.SIGKILL)
                    deadline = None
                continue
            if event[0] == "exit":
                _, rank, code = event
                pending.discard(rank)
                if code != 0 and rank not in killed and not stopping:
                    self.failed.add(rank)
                if stopping or rank in killed:
                    continue
                if code == 0:
                    if pending and self.finishing.since is None:
                        self.finishing.begin(time.monotonic())
                        quiet_check = self.finishing.next_check()
                    if self.lost is not None and self.lost[0] in pending and hang_check is None:
                        # It may only be slow to exit (a rank that left on purpose):
                        # give it the grace period before calling it hung.
                        hang_check = time.monotonic() + GRACE_SECONDS
                    continue
                message, exit_code = self._blame(rank, code)
                self.out.say(message)
                if code < 0:
                    self._await_verdicts(pending)
                self.signal_all(signal.SIGTERM)
            else:
                sig = event[1]
                if stopping:  # a second signal means "now"
                    self.signal_all(signal.SIGKILL)
                    continue
                exit_code = 128 + sig
                self.out.say(f"received {signal.Signals(sig).name}, "
                             f"forwarding to {len(pending)} rank(s)")
                self.signal_all(sig)
            stopping, deadline = True, time.monotonic() + GRACE_SECONDS
        self._say_victims()
        return exit_code

    def _kill(self, rank):
        try:
            os.killpg(self.procs[rank].pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self):
        # Grandchildren may outlive their rank; their group still dies here.
        self.signal_all(signal.SIGKILL, only_running=False)
        for proc in self.procs.values():
            try:
                proc.stdin.close()   # remote shims see EOF and end what is left
            except OSError:
                pass
        # A daemonised grandchild can hold a pipe open forever; bound the
        # total time spent draining rather than the time per thread.
        deadline = time.monotonic() + 2.0
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))


def install_signal_handlers(handler):
    """Route SIGINT and SIGTERM to handler (a Job's on_signal); returns what was there
    before, {signal: old handler}, to put back when the job is over."""
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: cannot own signals
            pass
    return saved


def _print_plan(out, plan, store_addr):
    out.say(f"store at {store_addr}")
    for s in plan:
        out.say(f"rank {s.rank} -> {s.host} (local {s.local_rank}/"
                f"{s.local_size}, cross {s.cross_rank}/{s.cross_size})")


def shim_argv(command):
    """The rank's command behind rank_shim (same interpreter on every host, as
    horovodrun assumes the same environment everywhere)."""
    python = os.environ.get(contract.REMOTE_PYTHON) or sys.executable
    return [python, "-m", "horovodlike.runner.rank_shim", *command]


def _start_ranks(job, args, store_addr, job_id):
    base = {k: v for k, v in os.environ.items() if k != jobkey.ENV}
    base.update(tuning_env(args))
    base.update({contract.STORE_ADDR: store_addr, contract.JOB_ID: job_id})
    if all(is_local_host(s.host) for s in job.plan):
        base[contract.BIND_ADDR] = "127.0.0.1"   # nobody off this host needs in
    cwd = os.getcwd()
    for slot in job.plan:
        env = rank_env(slot, len(job.plan), base)
        argv = shim_argv(args.command)
        if is_local_host(slot.host) and shutil.which(args.command[0], path=env.get("PATH")) is None:
            # The shim would report it too, but from inside a started rank.
            raise FileNotFoundError(errno.ENOENT, "no such executable", args.command[0])
        if is_local_host(slot.host):
            job.spawn(slot, argv, env)
        else:
            job.spawn(slot, remote_argv(args.ssh_command, slot.host, cwd, env, argv),
                      dict(base))


def run_static(args):
    """Run a job of a fixed size with our own rank processes; the launcher's exit status."""
    try:
        plan = compute_plan(args.host_list, args.num_proc)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = Output(RankOutput.from_args(args))
    bind_host, advertised = store_bind_and_advertise(plan)
    key = jobkey.generate()
    store = StoreServer(bind_host, 0, key=key, on_reject=out.say).start()
    store_addr = f"{advertised}:{store.port}"
    job = Job(plan, out, key, shutdown_grace=args.shutdown_grace)
    saved = install_signal_handlers(job.on_signal)
    try:
        if args.verbose:
            _print_plan(out, plan, store_addr)
        try:
            _start_ranks(job, args, store_addr, contract.new_job_id())
        except OSError as exc:
            out.say(f"failed to start rank {len(job.procs)}: {exc}")
            job.signal_all(signal.SIGTERM)
            return 127
        return job.wait()
    finally:
        job.cleanup()
        store.close()
        for sig, old in saved.items():
            signal.signal(sig, old)

"""``horovodlikerun``'s elastic mode: Horovod's ``horovodrun --min-np/--max-np
--host-discovery-script``.

    horovodlikerun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh python train.py

The driver polls the discovery script (``host[:slots]`` lines) every second, starts a
worker on every free slot (up to ``--max-np``), and forms *rounds*: in each round every
member gets a rank and a size through the rendezvous store and starts its engine with
them (common/elastic.py is the worker's side; docs/elastic.md the whole story). A new
round is formed when a member fails (its peers' collectives raise HorovodInternalError
and they come back ready), when a member finishes (exit 0) while others still train, or
when the driver announces new or removed hosts (members raise HostsUpdatedInterrupt at
their next commit). Rank 0 of a new round is its oldest survivor, whose state the
others receive.

A member that is stopped or hung never comes back ready: once its peers name it as
lost (or it stays quiet past ``--shutdown-grace`` while they wait), it is killed and
treated as failed, so the round re-forms without it. Once a member has finished, the
job is ending and no new worker starts. The discovery script runs in a process group
of its own, killed on its timeout and when the job ends.

A host whose worker fails is blacklisted (for good, or for ``--blacklist-cooldown-range``
seconds, doubling per failure); ``--reset-limit`` bounds the number of new rounds; with
fewer than ``--min-np`` usable slots the driver waits up to ``--elastic-timeout`` seconds
(``HOROVOD_ELASTIC_TIMEOUT``, default 600) and then fails the job saying so.

Workers are started exactly as static jobs start ranks (rank_shim, the job key on
stdin, ``--ssh-command`` for other hosts); output lines carry the *worker* id, which
stays the same while the worker's rank changes from round to round.
"""
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

from ..common import elastic as proto
from ..common import jobkey
from ..common import launch_contract as contract
from ..common.store import StoreClient, StoreServer
from . import args as cli
from . import exits, launch
from .rank_output import RankOutput

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
DISCOVERY_SCRIPT_TIMEOUT = 60.0
COOLDOWN_LOWER_LIMIT_SECONDS = 1          # Horovod's bounds on --blacklist-cooldown-range
COOLDOWN_UPPER_LIMIT_SECONDS = 3600
READY_GAP_SECONDS = 5.0
NEWCOMER_GRACE_SECONDS = 5.0
LOST_CONFIRM_SECONDS = 1.0     # a member named lost that has not exited by then hangs
RESET_LIMIT_EXCEEDED_MESSAGE = ("the job was stopped because the number of resets during "
                                "the elastic job exceeded the limit: {} (--reset-limit)")

# The states of a worker process.
STARTING = "starting"     # started, not yet a member of any round
MEMBER = "member"         # rank in the current (or last) round
LEAVING = "leaving"       # told to exit or being terminated: its exit means nothing
DONE = "done"             # a member that exited 0: its slot is not filled again
FAILED = "failed"         # exited non-zero (or could not start): its host is blacklisted
LEFT = "left"             # gone without consequence
_LIVE = (STARTING, MEMBER)

# A host name no machine has: makes store_bind_and_advertise choose a store every host
# can reach, since an elastic job's hosts are not known in advance.
_ANY_HOST = "(hosts that discovery will find)"




def is_elastic(args):
    return any(getattr(args, a, None) is not None
               for a in ("host_discovery_script", "min_num_proc", "max_num_proc"))


def run_elastic(args):
    """Run the job in elastic mode; returns the launcher's exit status."""
    try:
        settings = Settings(args)
    except ValueError as exc:
        print(f"{launch.PROG}: error: {exc}", file=sys.stderr)
        return 2
    return ElasticDriver(settings, args).run()


# ------------------------------------------------------------------ settings, hosts

class Settings:
    def __init__(self, args):
        self.np = args.num_proc
        self.min_np = getattr(args, "min_num_proc", None) or self.np
        self.max_np = getattr(args, "max_num_proc", None) or self.np
        if not 1 <= self.min_np <= self.np <= self.max_np:
            raise ValueError(f"elastic mode needs 1 <= --min-np ({self.min_np}) <= -np "
                             f"({self.np}) <= --max-np ({self.max_np})")
        timeout = getattr(args, "elastic_timeout", None)
        if timeout is None:
            timeout = contract.elastic_timeout()
        if timeout <= 0:
            raise ValueError(f"--elastic-timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.reset_limit = getattr(args, "reset_limit", None)
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ValueError(f"--reset-limit must be >= 0, got {self.reset_limit}")
        self.cooldown = getattr(args, "cooldown_range", None)
        if self.cooldown:
            lo, hi = self.cooldown
            if lo < COOLDOWN_LOWER_LIMIT_SECONDS or hi > COOLDOWN_UPPER_LIMIT_SECONDS or lo > hi:
                raise ValueError(f"--blacklist-cooldown-range {lo} {hi}: want "
                                 f"{COOLDOWN_LOWER_LIMIT_SECONDS} <= MIN <= MAX <= "
                                 f"{COOLDOWN_UPPER_LIMIT_SECONDS}")
        slots = getattr(args, "slots", None)
        if slots is not None and not 1 <= slots <= launch.MAX_SLOTS_PER_HOST:
            raise ValueError(f"--slots-per-host must be from 1 to "
                             f"{launch.MAX_SLOTS_PER_HOST}, got {slots}")
        self.grace = getattr(args, "shutdown_grace", None) or \
            cli.resolve_shutdown_grace(args)
        if getattr(args, "use_mpi", False):
            raise ValueError("elastic mode runs on horovodlikerun's own launcher; drop --mpi")
        script = getattr(args, "host_discovery_script", None)
        if script:
            self.discovery = ScriptDiscovery(script, slots)
        elif args.hosts:
            self.discovery = FixedDiscovery(launch.parse_hosts(args.hosts))
        else:
            raise ValueError("elastic mode needs --host-discovery-script or -H")


class ScriptDiscovery:
    """Runs the user's discovery script; its stdout is one 'host[:slots]' per line.

    The script runs in a process group of its own, and the whole group is killed when
    it runs past the timeout, once it has answered (what it left running in the
    background), and when the job ends (close()): a hung ssh or sleep inside it never
    outlives the job."""

    def __init__(self, script, default_slots, timeout=DISCOVERY_SCRIPT_TIMEOUT):
        self.script = script
        self.default_slots = default_slots
        self.timeout = timeout
        self._lock = threading.Lock()
        self._running = None            # the script's process while it runs
        self._closed = False

    def find(self):
        with self._lock:
            if self._closed:
                raise RuntimeError("the job is ending")
            proc = self._running = subprocess.Popen(
                self.script, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:
                proc.communicate(timeout=2.0)   # reap it; a pipe held elsewhere is let go
            except subprocess.TimeoutExpired:
                pass
            raise RuntimeError(f"host discovery script {self.script!r} ran longer than "
                               f"{self.timeout:g} s; its processes were killed") from None
        finally:
            with self._lock:
                self._running = None
        _kill_group(proc)               # whatever it left behind in its group
        if self._closed:
            raise RuntimeError("the job is ending")
        return self.parse(out, err, proc.returncode)

    def close(self):
        """The job ends: kill a script still running, and run no other."""
        with self._lock:
            self._closed = True
            proc = self._running
        if proc is not None:
            _kill_group(proc)           # find() reaps it and says the job is ending

    def parse(self, out, err, returncode):
        """{host: slots} from the script's output, in its order; O(lines)."""
        if returncode != 0:
            err = err.decode(errors="replace").strip()[-500:]
            raise RuntimeError(f"host discovery script {self.script!r} exited with code "
                               f"{returncode}" + (f": {err}" if err else ""))
        text = out.decode(errors="replace")
        # The usual answer, 'host:slots' lines, at C speed: every word of the text must
        # be one entry, else the line-by-line reading below says which line is wrong.
        entries = _ENTRY.findall(text)
        if entries and len(entries) == len(text.split()):
            hosts = dict(entries)
            # A few distinct counts: each converted and checked once.
            counts = {n: int(n) for n in set(hosts.values())}
            if all(1 <= c <= launch.MAX_SLOTS_PER_HOST for c in counts.values()):
                return dict(zip(hosts, map(counts.__getitem__, hosts.values())))
        hosts = {}
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue        # an empty answer means no host is available now
            if ":" not in line:
                if self.default_slots is None:
                    raise RuntimeError(f"host discovery script printed {line!r} without "
                                       f"':slots'; print host:slots or pass "
                                       f"--slots-per-host")
                line = f"{line}:{self.default_slots}"
            try:
                host, slots = launch.parse_host_entry(line)
            except ValueError as exc:
                raise RuntimeError(f"host discovery script {self.script!r}: {exc}") from None
            hosts[host] = slots
        return hosts


_ENTRY = re.compile(r"^[ \t]*(\S+):([0-9]{1,4})[ \t]*$", re.MULTILINE)


def _kill_group(proc):
    """SIGKILL the script's process group (its leader may be gone, its children not)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class FixedDiscovery:
    """-H host:slots,... as the only hosts there will ever be (fault tolerance only)."""

    def __init__(self, hosts):
        self.hosts = dict(hosts)

    def find(self):
        return dict(self.hosts)

    def close(self):
        pass


class HostState:
    """Blacklisting with Horovod's cooldown: MIN * 2^(failures-1) seconds plus a random
    fraction of MIN, capped to [MIN, MAX]; without a range, for good."""

    def __init__(self, cooldown):
        self.lower, self.upper = cooldown or (None, None)
        self.blacklisted = False
        self.failures = 0
        self.until = 0.0

    def blacklist(self, now):
        self.blacklisted = True
        if self.lower is None or self.until > now:
            return
        self.failures += 1
        delay = self.lower * (1 << (self.failures - 1)) + random.uniform(0, 1) * self.lower
        self.until = now + max(self.lower, min(self.upper, delay))

    def resurrected(self, now):
        return self.blacklisted and self.until > 0 and self.until <= now

    def whitelist(self):
        self.blacklisted = False
        self.until = 0.0


class Worker:
    __slots__ = ("wid", "host", "slot", "state", "ready", "rank", "removed")

    def __init__(self, wid, host, slot):
        self.wid, self.host, self.slot = wid, host, slot
        self.state = STARTING
        self.ready = None          # the reason it waits for a round, when it does
        self.rank = None
        self.removed = False       # its slot is gone: it leaves at the next round


# ------------------------------------------------------------------ the driver

class ElasticDriver:
    def __init__(self, settings, args):
        self.s = settings
        self.args = args
        self.out = launch.Output(RankOutput.from_args(args))   # --output-filename: per worker
        self.key = jobkey.generate()
        self.job_id = contract.new_job_id()
        self.keys = contract.ElasticKeys(self.job_id)
        self.job = launch.Job({}, self.out, self.key)
        self.events = self.job.events
        self.stopping = threading.Event()
        self.hosts = {}                     # host -> slots, from the last discovery
        self.order = {}                     # hosts in the order they were first found
                                            # (a dict used as an ordered set)
        self.host_state = defaultdict(lambda: HostState(settings.cooldown))
        self.workers = {}
        self.next_wid = 0
        self.started = False
        self.round_no = -1
        self.members = []                   # the current round's workers, by rank
        self.resets = 0
        self.update_seq = 0
        self.reset_wanted = False
        self.member_lost = False
        self.waiting_since = None
        self.newcomer_since = None          # when a worker first waited to join
        self.done_count = 0
        self.result = None
        self.last_discovery_error = None
        self.activity = launch.Activity(self.job)
        self.quiet_since = self.quiet_checked = None   # see check_quiet_members
        self.named_lost = {}                # wid -> (when, reporting wid); see check_named_lost

    # ---- lifecycle

    def run(self):
        try:
            first = self.s.discovery.find()
        except Exception as exc:   # noqa: BLE001 - a misconfiguration ends the job at once
            self.out.say(f"error: {exc}")
            return 1
        bind, advertised = launch.store_bind_and_advertise(
            [launch.RankSlot(0, _ANY_HOST, 0, 1, 0, 1)])
        store = StoreServer(bind, 0, key=self.key, on_reject=self.out.say).start()
        self.store_addr = f"{advertised}:{store.port}"
        local = "127.0.0.1" if bind in ("0.0.0.0", "") else bind
        self.local_store = f"{local}:{store.port}"
        self.client = StoreClient(self.local_store, key=self.key)
        self.base_env = {k: v for k, v in os.environ.items() if k != jobkey.ENV}
        self.base_env.update(launch.tuning_env(self.args))
        self.base_env.update({contract.STORE_ADDR: self.store_addr,
                              contract.JOB_ID: self.job_id, contract.ELASTIC: "1",
                              contract.ELASTIC_TIMEOUT: f"{self.s.timeout:g}"})
        saved = launch.install_signal_handlers(self.job.on_signal)
        threads = [threading.Thread(target=f, daemon=True)
                   for f in (self._watch_hosts, self._watch_ready)]
        try:
            if self.args.verbose:
                self.out.say(f"store at {self.store_addr}; elastic np={self.s.np} "
                             f"min={self.s.min_np} max={self.s.max_np}")
            self.on_hosts(first)
            for t in threads:
                t.start()
            while self.result is None:
                try:
                    event = self.events.get(timeout=0.2)
                except queue.Empty:
                    event = None
                if event is not None:
                    self.handle(event)
                self.step()
            return self.result
        finally:
            self.stopping.set()
            self.s.discovery.close()
            self._stop_workers()
            self.client.close()
            self.job.cleanup()
            store.close()
            for t in threads:
                t.join(timeout=2.0)
            for sig, old in saved.items():
                signal.signal(sig, old)

    def _stop_workers(self):
        live = {w.wid for w in self.workers.values() if self._alive(w)}
        if live:
            self.job.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + launch.GRACE_SECONDS
        while live:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.job.signal_all(signal.SIGKILL)
                break
            if event[0] == "exit":
                live.discard(event[1])
            elif event[0] == "signal":
                self.job.signal_all(signal.SIGKILL)

    def _alive(self, w):
        proc = self.job.procs.get(w.wid)
        return proc is not None and proc.returncode is None and w.state not in (DONE, FAILED, LEFT)

    def fail(self, message):
        if self.result is None:
            self.out.say(f"error: {message}")
            self.result = 1

    # ---- events

    def handle(self, event):
        kind = event[0]
        if kind == "exit":
            self.on_exit(event[1], event[2])
        elif kind == "ready":
            self.on_ready(*event[1:])
        elif kind == "hosts":
            self.on_hosts(event[1])
        elif kind == "discovery_error":
            if event[1] != self.last_discovery_error:   # transient: retried every second
                self.out.say(f"warning: {event[1]} (keeping the hosts found before)")
            self.last_discovery_error = event[1]
        elif kind == "signal":
            sig = event[1]
            self.out.say(f"received {signal.Signals(sig).name}, forwarding to the workers")
            self.job.signal_all(sig)
            self.result = 128 + sig

    def _watch_hosts(self):
        while not self.stopping.wait(DISCOVER_HOSTS_FREQUENCY_SECS):
            try:
                self.events.put(("hosts", self.s.discovery.find()))
            except Exception as exc:   # noqa: BLE001 - reported, retried
                if not self.stopping.is_set():
                    self.events.put(("discovery_error", str(exc)))

    def _watch_ready(self):
        """Workers announce they wait for a round as ready/<n> (n from ready_seq)."""
        try:
            client = StoreClient(self.local_store, key=self.key)
        except (OSError, TimeoutError):
            return
        k, gap_since = 1, None
        with client:
            while not self.stopping.is_set():
                try:
                    raw = client.get(self.keys.ready(k), timeout=0.5)
                except TimeoutError:
                    # A worker that died between taking number k and writing it leaves
                    # a gap; skip it once later numbers exist for a while.
                    try:
                        later = client.add(self.keys.ready_seq, 0) > k
                    except (OSError, RuntimeError):
                        return
                    gap_since = (gap_since or time.monotonic()) if later else None
                    if gap_since and time.monotonic() - gap_since > READY_GAP_SECONDS:
                        k, gap_since = k + 1, None
                    continue
                except (OSError, RuntimeError):
                    return
                k, gap_since = k + 1, None
                try:
                    self.events.put(("ready",) + proto.parse_ready(raw))
                except ValueError as exc:
                    self.events.put(("discovery_error", f"bad ready record: {exc}"))

    # ---- hosts and workers

    def usable(self, host):
        state = self.host_state.get(host)       # only hosts ever blacklisted have one
        return host in self.hosts and (state is None or not state.blacklisted)

    def available_slots(self):
        return sum(self.hosts.values()) - sum(
            self.hosts.get(h, 0) for h, state in self.host_state.items() if state.blacklisted)

    def on_hosts(self, hosts):
        """A discovery's answer. O(hosts + workers) per poll, the loops over the hosts
        in C (dict and set operations): 20,000 hosts take a few milliseconds."""
        self.last_discovery_error = None
        now = time.monotonic()
        for h, state in self.host_state.items():
            if h in hosts and state.resurrected(now):
                self.out.say(f"host {h} is out of its blacklist cooldown")
                state.whitelist()
        if hosts.keys() != self.hosts.keys():
            # Hosts keep their place while listed; one that comes back goes to the end.
            # Set and dict operations: C loops, O(n), no Python loop over the hosts.
            for h in self.order.keys() - hosts.keys():
                del self.order[h]
            self.order.update(dict.fromkeys(hosts))
        self.hosts = dict(hosts)
        if not self.started:
            return
        for w in list(self.workers.values()):
            if w.state in _LIVE and (w.host not in hosts or w.slot >= hosts[w.host]):
                self.remove(w, f"host {w.host} slot {w.slot} is no longer discovered")
        self.fill_slots()

    def ending(self):
        """The job is ending: it has its result, is stopping, or a member has finished
        its training (the others are about to). No new worker starts then."""
        return self.result is not None or self.stopping.is_set() or self.done_count > 0

    def fill_slots(self):
        if not self.started or self.ending():
            return
        staying = [w for w in self.workers.values() if w.state in _LIVE and not w.removed]
        room = self.s.max_np - len(staying)
        taken = {(w.host, w.slot) for w in self.workers.values()
                 if w.state in (STARTING, MEMBER, LEAVING, DONE)}
        for host in self.order:
            if not self.usable(host):
                continue
            for slot in range(self.hosts[host]):
                if room <= 0:
                    return
                if (host, slot) not in taken:
                    self.spawn(host, slot)
                    room -= 1

    def spawn(self, host, slot):
        wid = self.next_wid
        self.next_wid += 1
        w = self.workers[wid] = Worker(wid, host, slot)
        rs = launch.RankSlot(wid, host, slot, self.hosts[host], 0, 1)
        env = launch.rank_env(rs, self.s.max_np, self.base_env)
        env[contract.ELASTIC_WORKER] = str(wid)
        argv = launch.shim_argv(self.args.command)
        if self.args.verbose:
            self.out.say(f"starting worker {wid} on {host} (slot {slot})")
        try:
            if launch.is_local_host(host):
                self.job.spawn(rs, argv, env)
            else:
                self.job.spawn(rs, launch.remote_argv(self.args.ssh_command, host, os.getcwd(),
                                                      env, argv), dict(self.base_env))
        except OSError as exc:
            self.out.say(f"cannot start a worker on {host}: {exc}; blacklisting {host}")
            w.state = FAILED
            self.host_state[host].blacklist(time.monotonic())

    def terminate(self, w, sig=signal.SIGTERM):
        w.state = LEAVING             # its exit, when it comes, means nothing more
        proc = self.job.procs.get(w.wid)
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self, w, why):
        """Take a worker out: at once if it never joined; a member at the next round."""
        if w.state == STARTING:
            self.out.say(f"stopping worker {w.wid}: {why}")
            self.terminate(w)
        elif w.state == MEMBER and not w.removed:
            self.out.say(f"worker {w.wid} (rank {w.rank}) will leave at the next commit: {why}")
            w.removed = True
            if not self.reset_wanted:
                self.notify(proto.REMOVED)

    def notify(self, flags):
        """Tell the members (they raise HostsUpdatedInterrupt at their next check)."""
        if self.round_no < 0:
            return
        self.update_seq += 1
        self.client.set(self.keys.update(self.update_seq), str(flags).encode())

    def on_ready(self, wid, last, reason, lost=None):
        w = self.workers.get(wid)
        if w is None or w.state not in _LIVE or not self._alive(w):
            return
        if w.state == MEMBER and last != self.round_no:
            return                    # a stale record from a round already replaced
        w.ready = reason
        if w.state == MEMBER:
            self.reset_wanted = True
            if lost is not None and 0 <= lost < len(self.members):
                culprit = self.members[lost]
                self.named_lost.setdefault(culprit.wid, (time.monotonic(), wid))
        elif self.newcomer_since is None:
            self.newcomer_since = time.monotonic()

    def on_lost(self, w, how):
        """A member is lost (its peers named it, or it stayed quiet while they came
        back): stopped or hung, it would hold the next round back for ever. It is
        killed and its host blacklisted; the round re-forms without it, with a new
        worker on a spare slot if there is one."""
        if w.state != MEMBER or w.ready is not None:
            return                    # it has left already, or it is back and ready
        self.out.say(f"worker {w.wid} (rank {w.rank}, host {w.host}) was lost, {how}; "
                     f"killing it and blacklisting host {w.host}")
        self.terminate(w, signal.SIGKILL)   # a stopped process takes no SIGTERM
        self.member_lost = self.reset_wanted = True
        self.give_up_blob(w)
        self.blacklist(w.host)
        self.fill_slots()

    def check_named_lost(self, now):
        """Members their peers named as lost. One that crashed exits by itself and is
        reported with its exit status (on_exit); one still there LOST_CONFIRM_SECONDS
        after it was named is stopped or hung."""
        for wid, (when, reporter) in list(self.named_lost.items()):
            w = self.workers[wid]
            if w.state != MEMBER or w.ready is not None:
                del self.named_lost[wid]
            elif now - when >= LOST_CONFIRM_SECONDS:
                del self.named_lost[wid]
                self.on_lost(w, f"as worker {reporter} reported")

    def check_quiet_members(self, now):
        """While a round is to be re-formed and some members are ready, a member that
        is not and stays quiet (no output, no CPU time) past the shutdown grace -- the
        peer timeout plus a margin, by when its engine would have failed too -- is
        lost. Checked once a second: each check reads the process table."""
        waiting = [w for w in self.workers.values() if w.state == MEMBER and w.ready is None]
        back = any(w.state == MEMBER and w.ready for w in self.workers.values())
        if self.round_no < 0 or not self.reset_wanted or not waiting or not back:
            self.quiet_since = None
            return
        if self.quiet_since is None:
            self.quiet_since, self.quiet_checked = now, now
        if now - self.quiet_checked < 1.0:
            return
        self.quiet_checked = now
        for w in waiting:
            quiet, stopped = self.activity.quiet(w.wid, self.quiet_since, now)
            if quiet >= self.s.grace:
                self.on_lost(w, f"{'stopped' if stopped else 'silent'} for {quiet:.0f} s "
                                f"while its peers waited for the next round "
                                f"(--shutdown-grace)")

    def announce_newcomers(self, now):
        """Ask the members to make room for workers that are ready to join: once every
        worker started is ready, or NEWCOMER_GRACE_SECONDS after the first one was (so
        that hosts added together join in one round)."""
        if self.newcomer_since is None or self.round_no < 0:
            return
        starting = [w for w in self.workers.values()
                    if w.state == STARTING and self.usable(w.host) and not w.removed]
        if not any(w.ready for w in starting):
            self.newcomer_since = None
            return
        if self.reset_wanted:
            return                  # a round is coming anyway; they will be in it
        if any(w.ready is None for w in starting) and \
                now - self.newcomer_since < NEWCOMER_GRACE_SECONDS:
            return
        self.newcomer_since = None
        if self.args.verbose:
            self.out.say("workers " + ", ".join(str(w.wid) for w in starting if w.ready)
                         + " are ready; asking the members to make room")
        self.notify(proto.ADDED)

    def on_exit(self, wid, code):
        w = self.workers.get(wid)
        if w is None:
            return
        was_member = w.state == MEMBER
        if w.state == LEAVING:
            w.state = LEFT
            return
        if code == 0:
            w.state = DONE if was_member else LEFT
            if was_member:
                self.done_count += 1
                self.out.say(f"worker {wid} (rank {w.rank}, host {w.host}) finished")
        else:
            self.out.say(f"worker {wid} (host {w.host}"
                         + (f", rank {w.rank}" if was_member else "")
                         + f") {exits.exit_text(code)}; blacklisting host {w.host}")
            w.state = FAILED
            self.blacklist(w.host)
        if was_member:
            self.member_lost = self.reset_wanted = True
            self.give_up_blob(w)
        self.fill_slots()

    def give_up_blob(self, w):
        """A round still starting waits for this member's address: give the others
        one they cannot use, so they give up the round at once (see bootstrap)."""
        self.client.set(contract.blob_key(self.job_id, w.rank, elastic_round=self.round_no),
                        b"\0")

    def blacklist(self, host):
        self.host_state[host].blacklist(time.monotonic())
        for w in list(self.workers.values()):
            if w.host == host and w.state in _LIVE:
                self.remove(w, f"host {host} is blacklisted")

    # ---- rounds

    def _wait_for_slots(self, need, have, now):
        if self.waiting_since is None:
            self.waiting_since = now
            self.out.say(f"waiting for {need} slots (have {have}); giving up after "
                         f"{self.s.timeout:g} s (--elastic-timeout)")
        elif now - self.waiting_since > self.s.timeout:
            usable = ", ".join(f"{h}:{self.hosts[h]}" for h in self.order if self.usable(h))
            self.fail(f"timed out after {self.s.timeout:g} s waiting for at least {need} "
                      f"slots (--min-np {self.s.min_np}); only {have} available "
                      f"(usable hosts: {usable or 'none'})")

    def step(self):
        if self.result is not None:
            return
        now = time.monotonic()
        if not self.started:
            have = self.available_slots()
            if have < self.s.np:
                self._wait_for_slots(self.s.np, have, now)
                return
            self.started, self.waiting_since = True, None
            self.fill_slots()
        self.check_finished()
        if self.result is None:
            self.check_named_lost(now)
            self.check_quiet_members(now)
            self.announce_newcomers(now)
            self.try_publish(now)

    def try_publish(self, now):
        live = [w for w in self.workers.values() if w.state in _LIVE]
        if self.round_no < 0:
            if not live or any(w.ready is None for w in live):
                return            # the first round waits for every worker started
        elif not self.reset_wanted or any(w.ready is None for w in live if w.state == MEMBER):
            return
        ready = [w for w in live if w.ready and self.usable(w.host) and not w.removed]
        # Survivors keep their order (rank 0 is the oldest), newcomers follow by age.
        ready.sort(key=lambda w: (w.state != MEMBER, w.rank if w.state == MEMBER else w.wid))
        chosen = ready[:self.s.max_np]
        need = max(1, self.s.min_np - self.done_count)
        if len(chosen) < need:
            self._wait_for_slots(need, len(chosen), now)
            return
        if self.round_no >= 0:
            if not any(w.state == MEMBER for w in chosen):
                self.fail("no worker of the previous round is left to hand the training "
                          "state to the new ones")
                return
            if self.s.reset_limit is not None and self.resets >= self.s.reset_limit:
                self.fail(RESET_LIMIT_EXCEEDED_MESSAGE.format(self.s.reset_limit))
                return
            self.resets += 1
        # Ranks of a host together, hosts in the order of their oldest member.
        hosts = list(dict.fromkeys(w.host for w in chosen))
        chosen.sort(key=lambda w: hosts.index(w.host))
        sync = (self.round_no < 0 or self.member_lost
                or any(w.state == STARTING or w.ready == "failure" for w in chosen))
        self.publish(chosen, sync)

    def publish(self, chosen, sync):
        n = self.round_no + 1
        ranks = {w.wid: r for r, w in enumerate(chosen)}
        for w in self.workers.values():
            if w.state not in _LIVE:
                continue
            if w.wid in ranks:
                value = proto.Assignment(n, ranks[w.wid], len(chosen), sync,
                                         self.update_seq).encode()
            elif w.ready:
                why = "its slot was removed" if w.removed or not self.usable(w.host) \
                    else "the job already has --max-np workers"
                value = f"exit {why}".encode()
                w.state = LEAVING
            else:
                value = b"skip"
            self.client.set(self.keys.assignment(n, w.wid), value)
        self.client.set(self.keys.current, str(n).encode())
        for w in chosen:
            w.state, w.rank, w.ready = MEMBER, ranks[w.wid], None
        self.members = chosen
        self.round_no = n
        self.reset_wanted = self.member_lost = False
        self.waiting_since = None
        self.out.say(f"round {n}: {len(chosen)} ranks: " + ", ".join(
            f"{r}=worker {w.wid}@{w.host}" for r, w in enumerate(chosen))
            + ("" if sync else " (state kept, no sync)"))

    def check_finished(self):
        if self.result is not None:
            return
        if self.round_no < 0:
            if self.started and not any(w.state in _LIVE for w in self.workers.values()) \
                    and self.available_slots() == 0 and not self.s.cooldown:
                self.fail("every worker failed before the job could start, and every host "
                          "is blacklisted")
            return
        if any(w.state == MEMBER for w in self.members):
            return
        if all(w.state == DONE for w in self.members):
            self.result = 0
        else:
            self.fail(f"every member of round {self.round_no} is gone "
                      f"({', '.join(f'worker {w.wid}: {w.state}' for w in self.members)}); "
                      f"nobody holds the training state")

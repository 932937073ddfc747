"""Elastic training: Horovod's `hvd.elastic` API and the worker's side of the driver.

A job run by ``horovodlikerun --min-np/--max-np/--host-discovery-script`` goes through
*rounds*. In every round the driver (runner/elastic_driver.py) gives each member a rank
and a size; the members start an engine together (the blob exchange is keyed by the
round, so a process from an older round can never join a newer one); the training
function runs. When a member is lost, its peers' collectives raise
HorovodInternalError; when the driver finds hosts to add or remove it tells the
members, who raise HostsUpdatedInterrupt at their next ``commit()`` or
``check_host_updates()``. Either way ``run`` shuts the engine down, asks the driver for
the next round, and starts again from a state every member agrees on:

    HorovodInternalError    restore the last commit, join the next round, sync from rank 0
    HostsUpdatedInterrupt   keep the state, join the next round, sync if anyone is new

What the worker and the driver say to each other goes through the job's authenticated
store, as short text values (never pickles), under ``<job id>/elastic/``:

    ready_seq, ready/<n>     "<worker> <last round> <reason> [<lost rank>]": this worker
                             waits for a round; after a failure, the rank of the last
                             round its engine named as lost (the driver ends that member)
    current                  the newest round's number
    r<round>/w<worker>       "assign <rank> <size> <sync> <update seq>", "skip" (not in this
                             round: wait for the next) or "exit <why>"
    update/<k>               the k-th host update (1 removed, 2 added, 3 both)
"""
import functools
import logging
import os
import queue
import re
import threading

import numpy as np

from . import basics, engine, ops, request
from . import launch_contract as contract
from . import process_sets as _sets
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["State", "ObjectState", "run_fn", "HorovodInternalError", "HostsUpdatedInterrupt",
           "enabled", "init"]

log = logging.getLogger("horovodlike.elastic")

# HostUpdateResult's values in Horovod.
NO_UPDATE, REMOVED, ADDED, MIXED = 0, 1, 2, 3
REASONS = ("new", "failure", "interrupt")
# A round this many times in a row whose engine cannot start ends the worker.
MAX_FAILED_STARTS = 5
_MAX_VALUE = 512


def enabled():
    """True in a process that horovodlikerun's elastic driver started."""
    return bool(os.environ.get(contract.ELASTIC_WORKER)) and \
        bool(os.environ.get(contract.STORE_ADDR))


# How the engine names a lost rank (engine/core/fail.c), and the start-up's words for one.
_LOST = re.compile(r"rank (\d+) \(host [^)]*\) was lost")


def lost_rank(error):
    """The rank an engine error names as lost, or None."""
    m = _LOST.search(str(error))
    return int(m.group(1)) if m else None


def parse_ready(raw):
    """(worker, last round, reason, lost rank or None) from a ready/<n> value;
    ValueError if malformed."""
    if len(raw) > _MAX_VALUE:
        raise ValueError("ready record too long")
    fields = raw.decode("ascii").split()
    if len(fields) not in (3, 4):
        raise ValueError(f"{len(fields)} fields, want 3 or 4")
    wid, last, reason = fields[:3]
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    lost = int(fields[3]) if len(fields) == 4 else None
    if lost is not None and (reason != "failure" or lost < 0):
        raise ValueError("a lost rank goes only with a failure, and is >= 0")
    return int(wid), int(last), reason, lost


class Assignment:
    """What the driver told this worker for one round."""
    __slots__ = ("round", "rank", "size", "sync", "update_seq")

    def __init__(self, round_, rank, size, sync, update_seq):
        self.round, self.rank, self.size = round_, rank, size
        self.sync, self.update_seq = sync, update_seq

    def encode(self):
        return f"assign {self.rank} {self.size} {int(self.sync)} {self.update_seq}".encode()

    @classmethod
    def decode(cls, round_, fields):
        rank, size, sync, seq = (int(f) for f in fields)
        if not (0 <= rank < size) or sync not in (0, 1) or seq < 0:
            raise ValueError("assignment out of range")
        return cls(round_, rank, size, bool(sync), seq)


# ---------------------------------------------------------------- the worker's side

class _Worker:
    """This process's membership in an elastic job (one per process)."""

    def __init__(self):
        from . import jobkey
        from .store import StoreClient
        self.wid = int(os.environ[contract.ELASTIC_WORKER])
        self.keys = contract.ElasticKeys(contract.job_id())
        self.key = jobkey.from_env()
        self.addr = os.environ[contract.STORE_ADDR]
        self.client = StoreClient(self.addr, timeout=60.0, key=self.key)
        self.assignment = None       # the round this process last joined
        self.reason = "new"          # why it asks for the next one
        self.lost = None             # with "failure": the rank its engine named as lost
        self.process_sets = None     # what later rounds pass to init(): None or "dynamic"

    def _current(self):
        try:
            return int(self.client.get(self.keys.current, timeout=0))
        except TimeoutError:
            return -1

    def join(self):
        """Say this worker is ready; wait for the driver's next round; return the
        Assignment. A worker the driver leaves out for good exits here (status 0)."""
        import time
        last = self.assignment.round if self.assignment else -1
        current = self._current()     # read before saying ready: no round is missed
        seq = self.client.add(self.keys.ready_seq, 1)
        lost = f" {self.lost}" if self.reason == "failure" and self.lost is not None else ""
        self.client.set(self.keys.ready(seq),
                        f"{self.wid} {last} {self.reason}{lost}".encode())
        n = max(current, last) + 1
        wait = contract.elastic_timeout()
        deadline = time.monotonic() + wait + 60.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"horovodlike elastic: worker {self.wid} waited more than "
                    f"{wait:.0f} s ({contract.ELASTIC_TIMEOUT}) for the driver to form "
                    f"round {n}")
            try:
                raw = self.client.get(self.keys.assignment(n, self.wid),
                                      timeout=min(left, 60.0))
            except TimeoutError:
                continue
            kind, _, rest = raw.decode("ascii", "replace")[:_MAX_VALUE].partition(" ")
            if kind == "skip":
                n += 1
            elif kind == "exit":
                log.warning("horovodlike elastic: worker %s leaves the job: %s", self.wid,
                            rest)
                raise SystemExit(0)
            elif kind == "assign":
                return Assignment.decode(n, rest.split())
            else:
                raise RuntimeError(f"horovodlike elastic: the driver sent {raw[:80]!r}")


_worker = None


def _the_worker():
    global _worker
    if _worker is None:
        _worker = _Worker()
    return _worker


def current_assignment():
    return _worker.assignment if _worker is not None else None


def init(process_sets=None):
    """init() under the elastic driver: join the next round and start the engine with
    the rank and size it assigns. A round whose engine cannot start (a member died
    during start-up) is given up and the next one joined."""
    if basics.is_initialized() and engine.is_running():
        return
    w = _the_worker()
    if w.assignment is None:
        w.process_sets = "dynamic" if process_sets == "dynamic" else None
    failures = 0
    while True:
        a = w.join()
        # Static process sets are ranks of the first round; in later rounds those ranks
        # mean other processes, so every member starts with none (or "dynamic").
        sets = process_sets if a.round == 0 else w.process_sets
        os.environ.update(contract.rank_vars(a.rank, a.size))
        os.environ[contract.ELASTIC_ROUND] = str(a.round)
        # Unnamed ops are numbered per process: start every member of the round at zero.
        request.counters.reset()
        try:
            _sets.start(process_sets=sets)
            w.assignment = a
            w.reason, w.lost = "new", None
            return
        except (RuntimeError, TimeoutError, ConnectionError) as e:
            failures += 1
            basics.shutdown()
            w.assignment = a
            w.reason, w.lost = "failure", lost_rank(e)
            if failures >= MAX_FAILED_STARTS:
                raise
            log.warning("horovodlike elastic: round %s did not start (%s); waiting for "
                        "the next one", a.round, e)


def reset():
    """Shut the engine down and start it again (in the driver's next round, under
    horovodlikerun's elastic mode): what every framework's elastic.run does between
    attempts."""
    basics.shutdown()
    # The ranks mean other processes now: user sets are unregistered (re-add them in a
    # reset callback).
    _sets.forget_all()
    if enabled():
        init()
    else:
        _sets.start()


class _Notifications:
    """Delivers the driver's host updates to the states inside elastic.run (Horovod's
    WorkerNotificationManager). A daemon thread waits on the store for update k+1."""

    def __init__(self):
        self._lock = threading.Lock()
        self._listeners = set()
        self._thread = None

    def init(self):
        with self._lock:
            if self._thread is not None or not enabled():
                return
            self._thread = threading.Thread(target=self._watch, args=(_the_worker(),),
                                            name="horovodlike-elastic-updates", daemon=True)
            self._thread.start()

    def _watch(self, w):
        from .store import StoreClient
        try:
            client = StoreClient(w.addr, timeout=60.0, key=w.key)
        except (OSError, TimeoutError):
            return
        k = 1
        while True:
            try:
                raw = client.get(w.keys.update(k), timeout=3600.0)
                flags = int(raw[:16])
            except TimeoutError:
                continue
            except (OSError, RuntimeError, ValueError):
                return                          # the launcher is gone; so are we, soon
            self.handle_hosts_updated(k, flags)
            k += 1

    def register_listener(self, listener):
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener):
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp, update_res):
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)


notification_manager = _Notifications()


# ---------------------------------------------------------------- Horovod's API

class State:
    """State tracked in memory across workers: committed, restored after a failure and
    broadcast from rank 0 after a reset.

    bcast_object: broadcasts a picklable object from rank 0. get_rank: this rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = _round_update_seq()
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call after every reset (new membership), before the state is
        synchronized: rescale the learning rate, re-partition data, re-add process sets."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = _round_update_seq(self._last_updated_timestamp)
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Save the state in memory, then check_host_updates(). Costs a copy of the state
        and one small broadcast; see docs/elastic.md for measured costs."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank at once if the driver announced a
        change of hosts. All ranks must call it together (it is a collective)."""
        last = prev = self._last_updated_timestamp
        update = NO_UPDATE
        while not self._host_messages.empty():
            timestamp, res = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= int(res)
        # Rank 0's view decides, so every rank raises at the same step.
        prev, self._last_updated_timestamp, update = _broadcast_ints((prev, last, update))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(update == REMOVED)

    def save(self):
        """Save the state to host memory."""
        raise NotImplementedError()

    def restore(self):
        """Restore the last committed state, undoing uncommitted changes."""
        raise NotImplementedError()

    def sync(self):
        """Make every rank's state rank 0's."""
        raise NotImplementedError()

    def reset(self):
        """Called after a reset, before sync (for subclasses)."""


def _round_update_seq(default=0):
    a = current_assignment()
    return a.update_seq if a is not None else default


def _broadcast_ints(values):
    arr = np.asarray(values, np.int64)
    if basics.size() > 1:
        arr = ops.broadcast(arr, 0, name="elastic.check_host_updates")
    return [int(v) for v in arr]


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments and exposed as
    attributes (``state.epoch``, ``state.batch``)."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def run_fn(func, reset):
    """Horovod's hvd.elastic.run machinery: call func(state, ...) until it returns,
    re-forming the job after each HorovodInternalError or HostsUpdatedInterrupt."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as e:
                    state.restore()
                    skip_sync, reason, lost = False, "failure", lost_rank(e)
                    failure = str(e)
                except HostsUpdatedInterrupt as e:
                    # Every rank stopped at the same step: what they have now is what
                    # the next round starts from (also plain attributes changed since
                    # the last commit, which a sync would otherwise take back).
                    state.save()
                    skip_sync, reason, lost = e.skip_sync, "interrupt", None
                if enabled():
                    _the_worker().reason, _the_worker().lost = reason, lost
                reset()
                a = current_assignment()
                if reason == "failure":
                    # recovered from: a warning, not the engine's error
                    log.warning("%s; restored the last commit, now in round %s", failure,
                                a.round if a is not None else "?")
                if a is not None:
                    # The driver decides for the whole round (anyone new, anyone restored),
                    # so survivors never skip a sync that new members wait in.
                    skip_sync = not a.sync
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)
    return wrapper

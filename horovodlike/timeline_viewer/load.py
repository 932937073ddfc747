"""Find and parse per-rank timeline files.

The engine writes one Chrome Trace Event file per rank, ``<stem>.rank<r><ext>``, next to
the path given in HOROVOD_TIMELINE. A file is valid JSON at every moment while it is
written (each batch is written under an exclusive flock; we read under a shared one), but
a process that crashed may leave its last batch cut off, and a copied or size-limited
file may end anywhere; `parse_text` recovers every complete event of such a file.

Names (event names and tensor names) are interned once in a `Strings` table shared by
every rank, so the model and the analyses compare small integers, not strings.
"""
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

RANK_FILE = re.compile(r"^(?P<stem>.+)\.rank(?P<rank>\d+)(?P<ext>\.[A-Za-z0-9]+)?$")

# Event phases we keep (column `phase` in LoadedRank).
COMPLETE, INSTANT = 0, 1


class TraceError(Exception):
    """No usable trace: the message says what was looked for."""


class Strings:
    """Intern table: every distinct name gets one small integer, across all ranks."""

    def __init__(self):
        self.names = []
        self._index = {}

    def intern(self, s):
        i = self._index.get(s)
        if i is None:
            i = self._index[s] = len(self.names)
            self.names.append(s)
        return i

    def id(self, s, default=-1):
        return self._index.get(s, default)

    def __getitem__(self, i):
        return self.names[i]

    def __len__(self):
        return len(self.names)


@dataclass
class LoadedRank:
    """One rank's file, events as columns; times are still that rank's own ts."""
    path: str
    meta: dict
    rank: int
    lane_names: dict                 # tid -> lane name (thread_name metadata)
    process_name: str
    ts: np.ndarray                   # float64 microseconds, the rank's own clock
    dur: np.ndarray                  # float64 microseconds (0 for instants)
    name: np.ndarray                 # int32 into Strings
    lane: np.ndarray                 # int32 tid
    phase: np.ndarray                # int8 COMPLETE / INSTANT
    nbytes: np.ndarray               # int64, -1 when the event has no byte count
    tensors: list                    # per event: tuple of interned tensor names
    args: list                       # per event: the args dict, or None
    recovered: bool = False          # the file was cut off; events were recovered
    dropped: int = 0                 # events that could not be used
    notes: list = field(default_factory=list)


# --------------------------------------------------------------------- discovery

def _rank_of(path):
    m = RANK_FILE.match(Path(path).name)
    return int(m.group("rank")) if m else None


def _siblings(base):
    """Rank files of a base path: timeline.json -> timeline.rank*.json."""
    base = Path(base)
    # The engine appends .rank<r> before the extension, or .rank<r>.json when the path
    # has none (HOROVOD_TIMELINE=/tmp/tl -> /tmp/tl.rank0.json).
    stem, exts = (base.stem, {base.suffix}) if base.suffix else (base.name, {"", ".json"})
    folder = base.parent if str(base.parent) else Path(".")
    if not folder.is_dir():
        return []
    out = []
    for entry in folder.iterdir():
        m = RANK_FILE.match(entry.name)
        if m and m.group("stem") == stem and (m.group("ext") or "") in exts and entry.is_file():
            out.append(entry)
    return out


def _in_directory(folder):
    groups = {}
    for entry in folder.iterdir():
        m = RANK_FILE.match(entry.name)
        if m and entry.is_file() and (m.group("ext") or "").lower() == ".json":
            groups.setdefault((m.group("stem"), m.group("ext")), []).append(entry)
    if not groups:
        raise TraceError(f"no timeline files (*.rank<N>.json) in directory {folder}")
    if len(groups) > 1:
        names = ", ".join(sorted(f"{s}.rank*{e}" for s, e in groups))
        raise TraceError(f"directory {folder} holds several timelines ({names}); "
                         f"pass one base path, e.g. {folder / (sorted(groups)[0][0] + '.json')}")
    return next(iter(groups.values()))


def discover(paths):
    """Expand the user's paths into rank files, sorted by rank.

    Each path may be the base path given to HOROVOD_TIMELINE (all its .rank<N> siblings
    are taken), one rank file, or a directory holding one timeline's rank files.
    """
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(_in_directory(p))
        elif p.is_file() and _rank_of(p) is not None:
            found.append(p)
        else:
            sib = _siblings(p)
            if sib:
                found.extend(sib)
            elif p.is_file():
                found.append(p)          # a plain single-process Chrome trace
            else:
                stem = p.stem if p.suffix else p.name
                raise TraceError(f"no timeline at {p}: neither the file nor rank files "
                                 f"{p.parent / (stem + '.rank*' + p.suffix)} exist")
    unique = {}
    for f in found:
        unique.setdefault(os.path.realpath(f), f)
    files = list(unique.values())
    files.sort(key=lambda f: (_rank_of(f) if _rank_of(f) is not None else 1 << 30, str(f)))
    return files


# ----------------------------------------------------------------------- parsing

def _scan_events(text, start):
    """Decode objects one by one from an array body starting at `start`."""
    dec = json.JSONDecoder()
    events, i, n = [], start, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            break                            # the cut-off tail
        events.append(obj)
    return events


def _scan(text):
    """Last resort for a damaged file: recover otherData and every complete event."""
    dec = json.JSONDecoder()
    meta = {}
    m = re.search(r'"otherData"\s*:\s*', text)
    if m:
        try:
            meta, _ = dec.raw_decode(text, m.end())
        except ValueError:
            meta = {}
    m = re.search(r'"traceEvents"\s*:\s*\[', text)
    if m:
        return {"otherData": meta, "traceEvents": _scan_events(text, m.end())}
    s = text.lstrip()
    if s.startswith("["):
        return _scan_events(s, 1)
    return {"otherData": meta, "traceEvents": []}


def parse_text(text):
    """(document, recovered): the JSON of a trace file, recovering a cut-off file."""
    try:
        return json.loads(text), False
    except ValueError:
        pass
    s = text.rstrip()
    end = len(s)
    # Cut after the last complete event and close the brackets; the JSON parser decides
    # which cut is complete, so a cut inside an event's nested args is simply rejected.
    for _ in range(8):
        i = s.rfind("}", 0, end)
        if i < 0:
            break
        head = s[:i + 1]
        for tail in ("]}", "]"):
            try:
                return json.loads(head + tail), True
            except ValueError:
                pass
        end = i
    return _scan(s), True


def _read_locked(f):
    """Read a whole file under a shared flock: the engine writes each batch under an
    exclusive one, so a running job's file is never copied half-written."""
    try:
        import fcntl
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    except (ImportError, OSError):          # no flock here (Windows, some NFS): read anyway
        return f.read()
    try:
        return f.read()
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_document(path):
    with open(path, "rb") as f:
        raw = _read_locked(f)
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        return {"otherData": {}, "traceEvents": []}, True
    return parse_text(text)


# ------------------------------------------------------------------- to columns

def _num(x, default=0.0):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if v == v else default


class _TensorCache:
    """args -> tuple of interned tensor names, each distinct list formatted once."""

    def __init__(self, strings):
        self.strings, self.cache = strings, {}

    def __call__(self, args):
        t = args.get("tensors")
        if isinstance(t, list):
            try:
                key = tuple(t)
                got = self.cache.get(key)
            except TypeError:
                key, got = None, None
            if got is None:
                got = tuple(self.strings.intern(str(x)) for x in t)
                if key is not None:
                    self.cache[key] = got
            return got
        t = args.get("tensor")
        if t is None:
            return ()
        got = self.cache.get(t) if isinstance(t, str) else None
        if got is None:
            got = (self.strings.intern(str(t)),)
            if isinstance(t, str):
                self.cache[t] = got
        return got


def load_file(path, strings):
    """Parse one file into a LoadedRank (events in file order, B/E paired into spans)."""
    doc, recovered = read_document(path)
    if isinstance(doc, list):
        meta, events = {}, doc
    elif isinstance(doc, dict):
        meta = doc.get("otherData") or {}
        events = doc.get("traceEvents") or []
        if not isinstance(meta, dict):
            meta = {}
        if not isinstance(events, list):
            events = []
    else:
        meta, events = {}, []

    lane_names, process_name = {}, ""
    ts, dur, name, lane, phase, nbytes, tensors, argl = [], [], [], [], [], [], [], []
    open_spans = {}
    dropped = 0
    pids = set()
    intern = strings.intern
    tensors_of = _TensorCache(strings)
    for ev in events:
        if not isinstance(ev, dict):
            dropped += 1
            continue
        ph = ev.get("ph")
        if ph == "M":
            a = ev.get("args") or {}
            if ev.get("name") == "thread_name":
                lane_names[int(_num(ev.get("tid"), 0))] = str(a.get("name", ""))
            elif ev.get("name") == "process_name":
                process_name = str(a.get("name", ""))
            continue
        if ph not in ("X", "i", "I", "B", "E"):
            continue                       # counters, flows, ...: not ours
        pid = ev.get("pid")
        if type(pid) is int:
            pids.add(pid)
        tid = ev.get("tid", 0)
        if type(tid) is not int:
            tid = int(_num(tid, 0))
        if ph == "B":
            open_spans.setdefault(tid, []).append(ev)
            continue
        if ph == "E":
            stack = open_spans.get(tid)
            if not stack:
                dropped += 1
                continue
            b = stack.pop()
            args = dict(b.get("args") or {})
            args.update(ev.get("args") or {})
            t0 = _num(b.get("ts"))
            ev = {"name": b.get("name", ""), "ts": t0, "dur": _num(ev.get("ts")) - t0,
                  "args": args}
            ph = "X"
        args = ev.get("args")
        if type(args) is not dict:
            args = None
        t = ev.get("ts")
        ts.append(t if type(t) is float else _num(t))
        if ph == "X":
            d = ev.get("dur")
            dur.append(d if type(d) is float and d >= 0 else max(0.0, _num(d)))
            phase.append(COMPLETE)
        else:
            dur.append(0.0)
            phase.append(INSTANT)
        n = ev.get("name", "")
        name.append(intern(n if type(n) is str else str(n)))
        lane.append(tid)
        if args:
            b = args.get("bytes")
            nbytes.append(-1 if b is None else b if type(b) is int else int(_num(b, -1)))
            tensors.append(tensors_of(args))
        else:
            nbytes.append(-1)
            tensors.append(())
        argl.append(args)
    dropped += sum(len(s) for s in open_spans.values())

    rank = meta.get("rank")
    if not isinstance(rank, int):
        rank = _rank_of(path)
        if rank is None:
            rank = next(iter(pids)) if len(pids) == 1 else 0
    notes = []
    if recovered:
        notes.append(f"{path}: file was cut off (crashed or still being written); "
                     f"recovered {len(ts)} complete events")
    return LoadedRank(
        path=str(path), meta=meta, rank=rank, lane_names=lane_names,
        process_name=process_name,
        ts=np.asarray(ts, np.float64), dur=np.asarray(dur, np.float64),
        name=np.asarray(name, np.int32), lane=np.asarray(lane, np.int32),
        phase=np.asarray(phase, np.int8), nbytes=np.asarray(nbytes, np.int64),
        tensors=tensors, args=argl, recovered=recovered, dropped=dropped, notes=notes)


def load(paths, strings=None):
    """Discover and parse every rank file; returns (strings, [LoadedRank])."""
    strings = strings if strings is not None else Strings()
    files = discover(paths)
    return strings, [load_file(f, strings) for f in files]

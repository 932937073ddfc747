"""One Chrome/Perfetto-loadable trace with every rank: pid = rank, tid = lane, ts on the
common axis (microseconds since the earliest rank's first event).

Written event by event, so a large job does not need a second copy in memory. Rank 0's
``ready_us`` values are moved onto the same axis.
"""
import json

from .model import COMPLETE

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _meta(rank, name, value, tid=None):
    ev = {"name": name, "ph": "M", "pid": rank, "args": value}
    if tid is not None:
        ev["tid"] = tid
    return _dumps(ev)


def _num(x):
    x = round(x, 3)
    return int(x) if x.is_integer() else x


def iter_lines(tl):
    """The merged trace's events, each as one JSON text."""
    names = tl.strings.names
    for r, rt in tl.ranks.items():
        host = f" ({rt.hostname})" if rt.hostname else ""
        yield _meta(r, "process_name", {"name": f"rank {r}{host}"})
        yield _meta(r, "process_sort_index", {"sort_index": r})
        for tid in sorted(set(rt.lane.tolist()) | set(rt.lane_names)):
            yield _meta(r, "thread_name", {"name": rt.lane_label(tid)}, tid)
            yield _meta(r, "thread_sort_index", {"sort_index": tid}, tid)
    quoted = [_dumps(n) for n in names]
    for r, rt in tl.ranks.items():
        base = rt.start_epoch_us + rt.clock_offset_us - rt.t0_epoch_us   # own ts -> axis
        t, dur, name, lane, phase, args = (rt.t.tolist(), rt.dur.tolist(), rt.name.tolist(),
                                           rt.lane.tolist(), rt.phase.tolist(), rt.args)
        head = f',"pid":{r},"tid":'
        for i in range(len(t)):
            n = name[i]
            if phase[i] == COMPLETE:
                text = (f'{{"name":{quoted[n]},"ph":"X"{head}{lane[i]},"ts":{_num(t[i])},'
                        f'"dur":{_num(dur[i])}')
            else:
                s = "p" if names[n] == "STEP" else "t"
                text = f'{{"name":{quoted[n]},"ph":"i","s":"{s}"{head}{lane[i]},"ts":{_num(t[i])}'
            a = args[i]
            if a:
                ready = a.get("ready_us")
                if isinstance(ready, dict):
                    a = dict(a)
                    a["ready_us"] = {k: _axis(base, v) for k, v in ready.items()}
                try:
                    text += ',"args":' + _dumps(a)
                except ValueError:              # NaN or infinity in the engine's args
                    text += ',"args":' + _dumps(_finite(a))
            yield text + "}"


def _finite(x):
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _axis(base, v):
    try:
        x = float(v) + base
    except (TypeError, ValueError):
        return None
    return _num(x) if x == x else None


def render_merged(tl, path):
    other = {
        "merged_by": "horovodlike.timeline_viewer", "size": tl.size,
        "t0_since_epoch_in_micros": tl.t0_epoch_us,
        "ranks": {str(r): {"file": rt.path, "hostname": rt.hostname,
                           "start_time_since_epoch_in_micros": rt.start_epoch_us,
                           "clock_offset_us": rt.clock_offset_us}
                  for r, rt in tl.ranks.items()},
        "notes": tl.notes + ["ts, and rank 0's ready_us, are microseconds on one axis: "
                             "since the earliest rank's first event"],
    }
    with open(path, "w") as f:
        f.write('{"displayTimeUnit": "ms",\n "otherData": ')
        f.write(json.dumps(other))
        f.write(',\n "traceEvents": [\n')
        chunk, sep = [], ""
        for line in iter_lines(tl):
            chunk.append(line)
            if len(chunk) >= 20000:
                f.write(sep + ",\n".join(chunk))
                chunk, sep = [], ",\n"
        if chunk:
            f.write(sep + ",\n".join(chunk))
        f.write("\n]}\n")
    return path

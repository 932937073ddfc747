"""One self-contained HTML page: every rank's lanes on one time axis (canvas), with zoom
(mouse wheel), pan (drag), a tooltip per event, and the summary tables.

Everything is inline (data as JSON, script, style): the page makes no network request
and works from a file:// URL. The script and the style are kept as files in
horovodlike/timeline_viewer/static/ (viewer.js, viewer.css) and copied into every page. Events narrower than a pixel are merged while drawing, so
hundreds of thousands of events stay fluid; beyond `max_events` the shortest events
are left out of the page (the page says how many, and the tables still count them).
"""
import html
import json
from importlib import resources

import numpy as np

from .analyses.stragglers import late_intervals
from .fmt import fmt_bytes, fmt_ms, fmt_pct
from .load import Strings
from .model import COMPLETE, INSTANT, NEGOTIATE
from .report import headline, sections, title_line
from .style import LATE_COLOR, color_for

MAX_EVENTS = 400_000
_INSTANT_KINDS = ("ERROR", "TIMELINE_TRUNCATED", "CYCLE_START")


def _tensor_list(names, tensors, limit=6):
    shown = [names[t] for t in tensors[:limit]]
    more = len(tensors) - limit
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")


def _event_info(names, tens, nbytes, a):
    """Tooltip lines (after name, time and duration) for one event."""
    lines = []
    if tens:
        lines.append(("tensor: " if len(tens) == 1 else f"{len(tens)} tensors: ")
                     + _tensor_list(names, tens))
    if nbytes >= 0:
        lines.append(f"bytes: {fmt_bytes(nbytes)}")
    fused = a.get("fused")
    if fused is not None:
        lines.append(f"fused: {fused}")
    thr = a.get("fusion_threshold")
    if isinstance(thr, (int, float)) and thr > 0 and nbytes >= 0:
        lines.append(f"buffer fill: {fmt_pct(nbytes / thr)} of {fmt_bytes(thr)}")
    if a.get("algorithm"):
        lines.append(f"algorithm: {a['algorithm']}")
    if a.get("message"):
        lines.append(f"message: {a['message']}")
    if a.get("step") is not None:
        lines.append(f"step: {a['step']}")
    return "\n".join(lines)


class _Infos:
    """Tooltip text per event, formatted once per distinct (tensors, bytes, args)."""

    def __init__(self, names):
        self.names, self._cache = names, {}

    def __call__(self, rt_tensors, rt_nbytes, rt_args, i):
        a = rt_args[i] or {}
        key = (rt_tensors[i], rt_nbytes[i], a.get("fused"), a.get("fusion_threshold"),
               a.get("algorithm"), a.get("message"), a.get("step"))
        try:
            text = self._cache.get(key)
        except TypeError:                   # an unhashable arg value
            return _event_info(self.names, rt_tensors[i], rt_nbytes[i], a)
        if text is None:
            text = self._cache[key] = _event_info(self.names, rt_tensors[i], rt_nbytes[i], a)
        return text


def _round_info(strag):
    """{(rank, event index): tooltip lines} for negotiations matched across ranks."""
    out = {}
    idx = np.flatnonzero(strag.complete)
    if idx.size == 0:
        return out
    sub = strag.submit[idx]
    after_first = (sub - np.nanmin(sub, axis=1, keepdims=True)).tolist()
    ev = strag.ev_index[idx].tolist()
    last = strag.last[idx].tolist()
    late = strag.late[idx].tolist()
    spread = strag.spread[idx].tolist()
    for k in range(idx.size):
        head = (f"this round: rank {last[k]} submitted last, {fmt_ms(late[k])} after "
                f"the next rank ({fmt_ms(spread[k])} after the first)")
        for r, i in enumerate(ev[k]):
            if i >= 0:
                out[(r, i)] = "\n" + head + "\n" + (
                    f"this rank submitted {fmt_ms(after_first[k][r])} after the first"
                    if r != last[k] else "this rank was last")
    return out


def _keep_mask(tl, max_events):
    """Per rank, the events the page carries; drops the shortest beyond max_events."""
    total = tl.n_events
    if total <= max_events:
        return {r: np.ones(len(rt.t), bool) for r, rt in tl.ranks.items()}, 0, 0.0
    cyc = tl.name_id("CYCLE_START")
    durs = np.concatenate([np.where(rt.name == cyc, -1.0, rt.dur) if cyc >= 0 else rt.dur
                           for rt in tl.ranks.values()])
    cut = float(np.partition(durs, total - max_events)[total - max_events])
    keep, dropped = {}, 0
    keepers = {tl.name_id(n) for n in ("ERROR", "TIMELINE_TRUNCATED")} - {-1}
    for r, rt in tl.ranks.items():
        m = (rt.dur > cut) | np.isin(rt.name, list(keepers) or [-1])
        keep[r] = m
        dropped += int((~m).sum())
    return keep, dropped, cut


def build_data(rep, max_events=MAX_EVENTS):
    tl, st = rep.timeline, rep.stragglers
    names = tl.strings.names
    info = Strings()            # tooltip texts, each once
    rounds = _round_info(st)
    keep, dropped, cut = _keep_mask(tl, max_events)
    slow = st.verdict.slow_rank
    used = Strings()            # the event names the page draws

    rows, ev, inst, late = [], [], [], []
    infos_of = _Infos(names)
    for r, rt in tl.ranks.items():
        lanes = sorted(set(int(x) for x in np.unique(rt.lane)))
        tens_l, bytes_l, args_l = rt.tensors, rt.nbytes.tolist(), rt.args
        name_l, t_l = rt.name.tolist(), rt.t.tolist()
        ls, le = late_intervals(st, r) if st.n else (np.zeros(0), np.zeros(0))
        for tid in lanes:
            m = keep[r] & (rt.lane == tid)
            shown = (rt.phase[m] == COMPLETE) | np.isin(
                rt.name[m], [tl.name_id(n) for n in _INSTANT_KINDS])
            if not shown.any():
                continue                   # e.g. the cycles lane holding only STEP marks
            rows.append({"label": f"rank {r} \u00b7 {rt.lane_label(tid)}", "rank": r,
                         "lane": tid, "slow": r == slow})
            cm = np.flatnonzero(m & (rt.phase == COMPLETE))
            name_ids = rt.name[cm].tolist()
            row_names = [used.intern(names[n]) for n in name_ids]
            infos = [info.intern((infos_of(tens_l, bytes_l, args_l, i) +
                           rounds.get((r, i), "")).lstrip("\n")) for i in cm.tolist()]
            d = rt.dur[cm]
            ev.append({"s": np.round(rt.t[cm], 1).tolist(), "d": np.round(d, 1).tolist(),
                       "n": row_names, "i": infos,
                       "md": float(d.max()) if d.size else 0.0})
            im = np.flatnonzero(m & (rt.phase == INSTANT)).tolist()
            im = [i for i in im if names[name_l[i]] in _INSTANT_KINDS]
            inst.append({"t": [round(t_l[i], 1) for i in im],
                         "n": [used.intern(names[name_l[i]]) for i in im],
                         "i": [info.intern(infos_of(tens_l, bytes_l, args_l, i)) for i in im]})
            if tid == NEGOTIATE and ls.size:
                late.append({"s": np.round(ls, 1).tolist(),
                             "d": np.round(le - ls, 1).tolist(),
                             "i": [info.intern(f"the other ranks waited {fmt_ms(x)} for "
                                               f"rank {r} here (it submitted last)")
                                   for x in le - ls]})
            else:
                late.append(None)

    steps = [[round(s.start_us, 1), s.number] for s in rep.steps.steps]
    lo, hi = tl.span()
    name_list = used.names
    return {
        "title": title_line(rep),
        "span": [lo, max(hi, lo + 1.0)],
        "names": name_list,
        "colors": [color_for(n) for n in name_list],
        "lateColor": LATE_COLOR,
        "rows": rows, "ev": ev, "inst": inst, "late": late, "info": info.names,
        "steps": steps,
        "dropped": {"count": dropped, "below": fmt_ms(cut)} if dropped else None,
    }


def _static(name):
    """A file of horovodlike/timeline_viewer/static/ (package data, so installed copies have it)."""
    return resources.files(__package__).joinpath("static", name).read_text("utf-8")


def _table_html(sec):
    out = ["<table><thead><tr>"]
    for k, h in enumerate(sec.headers):
        cls = ' class="r"' if k in sec.right else ""
        out.append(f"<th{cls}>{html.escape(str(h))}</th>")
    out.append("</tr></thead><tbody>")
    for row in sec.rows:
        out.append("<tr>" + "".join(
            f'<td{" class=r" if k in sec.right else ""}>{html.escape(str(c))}</td>'
            for k, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def render_html(rep, path, max_events=MAX_EVENTS):
    data = build_data(rep, max_events)
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    head = headline(rep)
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
             # The page may not fetch anything: inline script and style only.
             "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
             "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">",
             f"<title>{html.escape(data['title'])}</title>"   # one line with the style
             f"<style>\n{_static('viewer.css')}</style></head><body>",
             "<header>", f"<h1>{html.escape(data['title'])}</h1>"]
    if head:
        parts.append(f"<p class=\"answer\">{html.escape(head[0])}</p>")
        parts.extend(f"<p class=\"sub\">{html.escape(x)}</p>" for x in head[1:])
    parts.append("</header>")
    note = ""
    if data["dropped"]:
        note = (f" &middot; {data['dropped']['count']} events shorter than "
                f"{html.escape(data['dropped']['below'])} are not drawn")
    parts.append("<div id=\"tv-controls\"><button id=\"tv-reset\" type=\"button\">reset "
                 "zoom</button><span>wheel: zoom &middot; drag: pan &middot; double-click: "
                 f"reset &middot; hover: details{note}</span><span id=\"tv-status\"></span>"
                 "</div><div id=\"tv-controls-legend\" style=\"padding:0 16px 6px 16px\">"
                 "<span id=\"tv-legend\"></span></div>")
    parts.append("<div id=\"tv-wrap\"><div id=\"tv-axisrow\"><div id=\"tv-axispad\"></div>"
                 "<canvas id=\"tv-axis\"></canvas></div><div id=\"tv-body\">"
                 "<div id=\"tv-labels\"></div><canvas id=\"tv-canvas\"></canvas></div></div>"
                 "<div id=\"tv-tip\"></div>")
    parts.append("<main>")
    for sec in sections(rep):
        parts.append(f"<h2 id=\"sec-{sec.key}\">{html.escape(sec.title)}</h2>")
        if sec.headers:
            parts.append(_table_html(sec))
        parts.extend(f"<p class=\"note\">{html.escape(x)}</p>" for x in sec.lines)
    parts.append("</main>")
    parts.append(f"<script type=\"application/json\" id=\"tv-data\">{blob}</script>")
    parts.append(f"<script>\n{_static('viewer.js')}</script></body></html>\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path

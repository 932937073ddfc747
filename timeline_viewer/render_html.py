"""One self-contained HTML page: every rank's lanes on one time axis (canvas), with zoom
(mouse wheel), pan (drag), a tooltip per event, and the summary tables.

Everything is inline (data as JSON, script, style): the page makes no network request
and works from a file:// URL. Events narrower than a pixel are merged while drawing, so
hundreds of thousands of events stay fluid; beyond `max_events` the shortest events
are left out of the page (the page says how many, and the tables still count them).
"""
import html
import json

import numpy as np

from .analyses.stragglers import late_intervals
from .fmt import fmt_bytes, fmt_ms, fmt_pct
from .model import COMPLETE, INSTANT, NEGOTIATE
from .render_text import headline, sections, title_line
from .style import LATE_COLOR, color_for

MAX_EVENTS = 400_000
_INSTANT_KINDS = ("ERROR", "TIMELINE_TRUNCATED", "CYCLE_START")


class _Interner:
    def __init__(self):
        self.items, self._ix = [], {}

    def __call__(self, s):
        i = self._ix.get(s)
        if i is None:
            i = self._ix[s] = len(self.items)
            self.items.append(s)
        return i


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
    info = _Interner()
    rounds = _round_info(st)
    keep, dropped, cut = _keep_mask(tl, max_events)
    slow = st.verdict.slow_rank
    used = {}

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
            row_names = [used.setdefault(names[n], len(used)) for n in name_ids]
            infos = [info((infos_of(tens_l, bytes_l, args_l, i) +
                           rounds.get((r, i), "")).lstrip("\n")) for i in cm.tolist()]
            d = rt.dur[cm]
            ev.append({"s": np.round(rt.t[cm], 1).tolist(), "d": np.round(d, 1).tolist(),
                       "n": row_names, "i": infos,
                       "md": float(d.max()) if d.size else 0.0})
            im = np.flatnonzero(m & (rt.phase == INSTANT)).tolist()
            im = [i for i in im if names[name_l[i]] in _INSTANT_KINDS]
            inst.append({"t": [round(t_l[i], 1) for i in im],
                         "n": [used.setdefault(names[name_l[i]], len(used)) for i in im],
                         "i": [info(infos_of(tens_l, bytes_l, args_l, i)) for i in im]})
            if tid == NEGOTIATE and ls.size:
                late.append({"s": np.round(ls, 1).tolist(),
                             "d": np.round(le - ls, 1).tolist(),
                             "i": [info(f"the other ranks waited {fmt_ms(x)} for rank {r} "
                                        f"here (it submitted last)") for x in le - ls]})
            else:
                late.append(None)

    steps = [[round(s.start_us, 1), s.number] for s in rep.steps.steps]
    lo, hi = tl.span()
    name_list = [None] * len(used)
    for n, k in used.items():
        name_list[k] = n
    return {
        "title": title_line(rep),
        "span": [lo, max(hi, lo + 1.0)],
        "names": name_list,
        "colors": [color_for(n) for n in name_list],
        "lateColor": LATE_COLOR,
        "rows": rows, "ev": ev, "inst": inst, "late": late, "info": info.items,
        "steps": steps,
        "dropped": {"count": dropped, "below": fmt_ms(cut)} if dropped else None,
    }


_CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222}
header{padding:10px 16px;border-bottom:1px solid #ddd;background:#fafafa}
h1{font-size:15px;margin:0 0 4px 0;font-weight:600}
.answer{font-size:15px;font-weight:600;margin:2px 0}
.sub{margin:2px 0;color:#444}
#tv-controls{padding:6px 16px;display:flex;gap:12px;align-items:center;flex-wrap:wrap}
#tv-controls button{font:inherit;padding:2px 10px}
#tv-legend span.sw{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px;
 vertical-align:-1px;border-radius:2px}
#tv-wrap{position:relative;margin:0 16px;border:1px solid #ddd;user-select:none}
#tv-axisrow{position:sticky;top:0;z-index:2;background:#fff;display:flex;
 border-bottom:1px solid #ddd}
#tv-axispad{flex:0 0 170px}
#tv-body{display:flex}
#tv-labels{position:relative;flex:0 0 170px;overflow:hidden;border-right:1px solid #ddd}
.lane-label{position:absolute;left:0;right:0;padding:0 6px;font-size:11px;
 white-space:nowrap;overflow:hidden;text-overflow:ellipsis;line-height:16px}
.lane-label.slow{color:#b71c1c;font-weight:600}
#tv-canvas{display:block;cursor:grab}
#tv-canvas.drag{cursor:grabbing}
#tv-tip{position:fixed;display:none;z-index:5;background:#fffffe;border:1px solid #999;
 padding:5px 8px;font-size:12px;max-width:520px;box-shadow:0 2px 6px rgba(0,0,0,.2);
 pointer-events:none;white-space:pre-wrap}
#tv-tip b{display:block}
main{padding:8px 16px 40px 16px}
h2{font-size:14px;margin:18px 0 6px 0}
table{border-collapse:collapse;font-size:12px}
th,td{padding:2px 8px;border-bottom:1px solid #eee;text-align:left;white-space:nowrap}
th{background:#f3f3f3}
td.r,th.r{text-align:right}
p.note{margin:4px 0;color:#444}
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("tv-data").textContent);
  var LABEL_W = 170, ROW_H = 16, RANK_GAP = 6, AXIS_H = 32;
  var wrap = document.getElementById("tv-wrap");
  var labels = document.getElementById("tv-labels");
  var canvas = document.getElementById("tv-canvas");
  var axis = document.getElementById("tv-axis");
  var tip = document.getElementById("tv-tip");
  var status = document.getElementById("tv-status");
  var ctx = canvas.getContext("2d"), actx = axis.getContext("2d");
  var dpr = window.devicePixelRatio || 1;
  var rowY = [], y = 0, prev = null, i;
  for (i = 0; i < D.rows.length; i++) {
    var row = D.rows[i];
    if (prev !== null && row.rank !== prev) { y += RANK_GAP; }
    rowY.push(y);
    var el = document.createElement("div");
    el.className = "lane-label" + (row.slow ? " slow" : "");
    el.style.top = y + "px";
    el.style.height = ROW_H + "px";
    el.setAttribute("data-rank", String(row.rank));
    el.setAttribute("data-lane", String(row.lane));
    el.textContent = row.label;
    el.title = row.label;
    labels.appendChild(el);
    y += ROW_H;
    prev = row.rank;
  }
  var H = Math.max(y, ROW_H);
  var stepT = D.steps.map(function (st) { return st[0]; });
  labels.style.height = H + "px";
  var full = {x0: D.span[0], x1: D.span[1]};
  var pad = (full.x1 - full.x0) * 0.01;
  full.x0 -= pad; full.x1 += pad;
  var view = {x0: full.x0, x1: full.x1};
  var W = 100;

  // Legend.
  var legend = document.getElementById("tv-legend");
  D.names.forEach(function (n, k) {
    if (n === "CYCLE_START") { return; }
    var sw = document.createElement("span");
    sw.className = "sw"; sw.style.background = D.colors[k];
    legend.appendChild(sw);
    legend.appendChild(document.createTextNode(n));
  });
  if (D.late.some(function (l) { return l !== null; })) {
    var sw2 = document.createElement("span");
    sw2.className = "sw"; sw2.style.background = D.lateColor;
    legend.appendChild(sw2);
    legend.appendChild(document.createTextNode("others waiting for this rank"));
  }

  function lowerBound(a, x) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < x) { lo = m + 1; } else { hi = m; } }
    return lo;
  }

  function fmtT(us, step) {
    var a = Math.abs(step || us);
    if (a >= 1e6) { return (us / 1e6).toFixed(step >= 1e6 ? 0 : (step >= 1e5 ? 1 : 2)) + " s"; }
    if (a >= 1e3) { return (us / 1e3).toFixed(step >= 1e3 ? 0 : (step >= 100 ? 1 : 2)) + " ms"; }
    return us.toFixed(step >= 1 ? 0 : 1) + " us";
  }
  function fmtD(us) {
    if (Math.abs(us) < 0.05) { us = 0; }
    var a = Math.abs(us);
    if (a >= 1e6) { return (us / 1e6).toFixed(3) + " s"; }
    if (a >= 1e3) { return (us / 1e3).toFixed(a >= 1e5 ? 0 : (a >= 1e4 ? 1 : 2)) + " ms"; }
    return us.toFixed(1) + " us";
  }

  function resize() {
    W = Math.max(200, wrap.clientWidth - LABEL_W - 2);
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    axis.width = Math.round(W * dpr); axis.height = Math.round(AXIS_H * dpr);
    axis.style.width = W + "px"; axis.style.height = AXIS_H + "px";
    draw();
  }

  function drawAxis(k) {
    actx.setTransform(dpr, 0, 0, dpr, 0, 0);
    actx.clearRect(0, 0, W, AXIS_H);
    actx.fillStyle = "#333"; actx.strokeStyle = "#999";
    actx.font = "11px system-ui, sans-serif";
    var raw = (view.x1 - view.x0) / Math.max(1, W / 110);
    var p = Math.pow(10, Math.floor(Math.log(raw) / Math.LN10));
    var step = raw / p <= 1 ? p : raw / p <= 2 ? 2 * p : raw / p <= 5 ? 5 * p : 10 * p;
    var t = Math.ceil(view.x0 / step) * step;
    for (; t <= view.x1; t += step) {
      var x = (t - view.x0) * k;
      actx.beginPath(); actx.moveTo(x + 0.5, AXIS_H - 6); actx.lineTo(x + 0.5, AXIS_H); actx.stroke();
      actx.fillText(fmtT(t, step), x + 3, AXIS_H - 9);
    }
    // Step numbers along the top, where there is room.
    actx.fillStyle = "#777"; actx.font = "10px system-ui, sans-serif";
    var lastEnd = -1e9;
    for (var j = lowerBound(stepT, view.x0); j < stepT.length && stepT[j] <= view.x1; j++) {
      var sx = (stepT[j] - view.x0) * k;
      if (sx < lastEnd + 6) {          // skip labels that would overlap; jump ahead
        j = Math.max(j, lowerBound(stepT, view.x0 + (lastEnd + 6) / k) - 1);
        continue;
      }
      var label = "step " + D.steps[j][1];
      actx.fillRect(Math.round(sx), 0, 1, 11);
      actx.fillText(label, sx + 3, 9);
      lastEnd = sx + 3 + actx.measureText(label).width;
    }
  }

  function draw() {
    var k = W / (view.x1 - view.x0);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    var r, j;
    for (r = 0; r < D.rows.length; r++) {
      if (D.rows[r].slow) { ctx.fillStyle = "rgba(214,39,40,0.07)"; ctx.fillRect(0, rowY[r], W, ROW_H); }
      else if (D.rows[r].rank % 2) { ctx.fillStyle = "#f7f7f7"; ctx.fillRect(0, rowY[r], W, ROW_H); }
    }
    // Step marks.
    ctx.strokeStyle = "rgba(60,60,60,0.35)"; ctx.lineWidth = 1;
    var sa = lowerBound(stepT, view.x0), sb = lowerBound(stepT, view.x1);
    if (sb - sa <= W / 6) {            // too dense to help: leave them to the axis
      for (j = sa; j < sb; j++) {
        var sx = Math.round((stepT[j] - view.x0) * k) + 0.5;
        ctx.beginPath(); ctx.moveTo(sx, 0); ctx.lineTo(sx, H); ctx.stroke();
      }
    }
    var drawn = 0;
    for (r = 0; r < D.rows.length; r++) {
      var E = D.ev[r], y0 = rowY[r] + 2, h = ROW_H - 4;
      if (E.s.length) {
        var a = lowerBound(E.s, view.x0 - E.md), b = lowerBound(E.s, view.x1);
        var cc = -1, xa = 0, xb = -1;
        for (j = a; j < b; j++) {
          var s = E.s[j], e = s + E.d[j];
          if (e < view.x0) { continue; }
          var p0 = Math.max(-2, (s - view.x0) * k), p1 = Math.min(W + 2, (e - view.x0) * k);
          if (p1 - p0 < 1) { p1 = p0 + 1; }
          var c = E.n[j];
          drawn++;
          if (c === cc && p0 <= xb + 0.5) { if (p1 > xb) { xb = p1; } continue; }
          if (cc >= 0) { ctx.fillStyle = D.colors[cc]; ctx.fillRect(xa, y0, xb - xa, h); }
          cc = c; xa = p0; xb = p1;
        }
        if (cc >= 0) { ctx.fillStyle = D.colors[cc]; ctx.fillRect(xa, y0, xb - xa, h); }
      }
      var L = D.late[r];
      if (L && L.s.length) {
        ctx.fillStyle = D.lateColor; ctx.globalAlpha = 0.75;
        var la = Math.max(0, lowerBound(L.s, view.x0) - 1), lb = lowerBound(L.s, view.x1);
        for (j = la; j < lb; j++) {
          var q0 = (L.s[j] - view.x0) * k, q1 = (L.s[j] + L.d[j] - view.x0) * k;
          if (q1 < 0) { continue; }
          ctx.fillRect(Math.max(-2, q0), y0 + 3, Math.max(1, Math.min(W + 2, q1) - Math.max(-2, q0)), h - 6);
        }
        ctx.globalAlpha = 1;
      }
      var I = D.inst[r];
      for (j = lowerBound(I.t, view.x0); j < I.t.length && I.t[j] <= view.x1; j++) {
        var ix = (I.t[j] - view.x0) * k, nm = D.names[I.n[j]];
        ctx.fillStyle = D.colors[I.n[j]];
        if (nm === "CYCLE_START") { ctx.fillRect(Math.round(ix), y0 + 2, 1, h - 4); }
        else {
          ctx.beginPath(); ctx.moveTo(ix - 5, y0); ctx.lineTo(ix + 5, y0); ctx.lineTo(ix, y0 + h); ctx.closePath(); ctx.fill();
        }
      }
    }
    drawAxis(k);
    canvas.setAttribute("data-view", view.x0.toFixed(1) + "," + view.x1.toFixed(1));
    status.textContent = D.rows.length + " lanes, " + drawn + " events in view, " +
      fmtD(view.x1 - view.x0) + " shown";
  }

  function rowAt(py) {
    var r = lowerBound(rowY, py + 1) - 1;
    if (r < 0 || py > rowY[r] + ROW_H) { return -1; }
    return r;
  }

  function hit(r, t, tol) {
    var best = null, j, n = 0;
    var L = D.late[r];
    if (L) {
      for (j = lowerBound(L.s, t + tol) - 1; j >= 0 && n < 5000; j--, n++) {
        if (L.s[j] + L.d[j] + tol < t) { break; }
        if (L.s[j] - tol <= t) { return {name: "waiting for rank " + D.rows[r].rank, s: L.s[j], d: L.d[j], info: D.info[L.i[j]]}; }
      }
    }
    var I = D.inst[r];
    for (j = lowerBound(I.t, t - tol); j < I.t.length && I.t[j] <= t + tol; j++) {
      return {name: D.names[I.n[j]], s: I.t[j], d: null, info: D.info[I.i[j]]};
    }
    var E = D.ev[r];
    var lo = lowerBound(E.s, t - E.md - tol);
    for (j = lowerBound(E.s, t + tol) - 1, n = 0; j >= lo && n < 20000; j--, n++) {
      if (E.s[j] - tol <= t && t <= E.s[j] + E.d[j] + tol) {
        if (best === null || E.d[j] < best.d) {
          best = {name: D.names[E.n[j]], s: E.s[j], d: E.d[j], info: D.info[E.i[j]]};
        }
      }
    }
    return best;
  }

  function showTip(ev, r, h) {
    while (tip.firstChild) { tip.removeChild(tip.firstChild); }
    var b = document.createElement("b");
    b.textContent = h.name;
    tip.appendChild(b);
    var lines = [D.rows[r].label, "start " + fmtD(h.s - D.span[0]) +
      (h.d !== null ? ", duration " + fmtD(h.d) : "")];
    if (h.info) { lines = lines.concat(h.info.split("\n")); }
    tip.appendChild(document.createTextNode(lines.join("\n")));
    tip.style.display = "block";
    var x = ev.clientX + 14, yy = ev.clientY + 14;
    var tw = tip.offsetWidth, th = tip.offsetHeight;
    if (x + tw > window.innerWidth - 4) { x = Math.max(4, ev.clientX - tw - 14); }
    if (yy + th > window.innerHeight - 4) { yy = Math.max(4, ev.clientY - th - 14); }
    tip.style.left = x + "px"; tip.style.top = yy + "px";
  }

  var drag = null;
  canvas.addEventListener("mousedown", function (ev) {
    drag = {x: ev.clientX, x0: view.x0, x1: view.x1};
    canvas.className = "drag"; tip.style.display = "none"; ev.preventDefault();
  });
  window.addEventListener("mouseup", function () { drag = null; canvas.className = ""; });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) { return; }
    var dt = (ev.clientX - drag.x) * (drag.x1 - drag.x0) / W;
    view.x0 = drag.x0 - dt; view.x1 = drag.x1 - dt;
    draw();
  });
  canvas.addEventListener("mousemove", function (ev) {
    if (drag) { return; }
    var rect = canvas.getBoundingClientRect();
    var px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    var r = rowAt(py);
    if (r < 0) { tip.style.display = "none"; return; }
    var k = W / (view.x1 - view.x0);
    var h = hit(r, view.x0 + px / k, 3 / k);
    if (h) { showTip(ev, r, h); } else { tip.style.display = "none"; }
  });
  canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  function zoom(ev) {
    ev.preventDefault();
    var rect = canvas.getBoundingClientRect();
    var px = Math.min(Math.max(ev.clientX - rect.left, 0), W);
    var dy = ev.deltaY * (ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? 400 : 1);
    var f = Math.exp(Math.max(-300, Math.min(300, dy)) * 0.002);
    var span = view.x1 - view.x0, t = view.x0 + px / W * span;
    var ns = Math.min(Math.max(span * f, 2), (full.x1 - full.x0) * 4);
    view.x0 = t - px / W * ns; view.x1 = view.x0 + ns;
    tip.style.display = "none";
    draw();
  }
  canvas.addEventListener("wheel", zoom, {passive: false});
  axis.addEventListener("wheel", zoom, {passive: false});
  function reset() { view.x0 = full.x0; view.x1 = full.x1; draw(); }
  canvas.addEventListener("dblclick", reset);
  document.getElementById("tv-reset").addEventListener("click", reset);
  window.addEventListener("resize", resize);
  resize();
  document.body.setAttribute("data-rendered", "yes");
}());
"""


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
             f"<title>{html.escape(data['title'])}</title><style>{_CSS}</style></head><body>",
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
    parts.append(f"<script>{_JS}</script></body></html>\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path

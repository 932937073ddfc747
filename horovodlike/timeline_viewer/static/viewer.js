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

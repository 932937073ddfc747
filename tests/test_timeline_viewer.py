"""horovodlike.timeline_viewer on traces written by real multi-rank runs.

One 4-rank job (module fixture) in which rank 2 sleeps before every allreduce; the
viewer must name rank 2 as the slow rank, recover cut-off files, and produce a PNG, a
merged trace that json.loads, and an HTML page that renders in headless Chromium with
no console error and no network request.
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from harness import rank_program, run_ranks

import horovodlike.timeline_viewer as timeline_viewer
from horovodlike.timeline_viewer import analyze_paths
from horovodlike.timeline_viewer.load import Strings, discover, load_file, parse_text

NP = 4                     # the issue asks for a 4-rank run with one rank slowed
SLOW_RANK = 2
SLEEP_S = 0.03
STEPS = 8

DELAYED = rank_program("timeline_viewer_delayed")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Base path of the delayed job's timeline (timeline.json -> timeline.rank<r>.json)."""
    d = tmp_path_factory.mktemp("tl")
    base = d / "timeline.json"
    res = run_ranks(DELAYED, np=NP, launcher="horovodlikerun", args=(STEPS, SLOW_RANK, SLEEP_S),
                    env={"HOROVOD_TIMELINE": str(base)}, timeout=120)
    res.assert_ok()
    files = [d / f"timeline.rank{r}.json" for r in range(NP)]
    missing = [str(f) for f in files if not f.exists()]
    assert not missing, f"the engine wrote no timeline file(s) {missing}\n{res.describe()}"
    return base


def run_cli(capsys, *argv):
    rc = timeline_viewer.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------- loading

def _event_ends(text):
    """Offsets just past each complete non-metadata event of a trace file."""
    dec = json.JSONDecoder()
    i = re.search(r'"traceEvents"\s*:\s*\[', text).end()
    ends = []
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return ends
        ev, i = dec.raw_decode(text, i)
        if ev["ph"] != "M":
            ends.append(i)


def test_loader_recovers_every_complete_event_of_a_cut_off_file(trace, tmp_path):
    src = trace.parent / "timeline.rank0.json"
    text = src.read_text()
    full = json.loads(text)
    ends = _event_ends(text)
    n_events = sum(1 for e in full["traceEvents"] if e["ph"] != "M")
    assert len(ends) == n_events > 20
    # Cuts: inside an event's nested ready_us, just after an event's brace, mid-line.
    nested = text.index('"ready_us": {') + len('"ready_us": {') + 3
    cuts = [nested, ends[len(ends) // 2], ends[len(ends) // 3] + 7, len(text) - 5]
    for cut in cuts:
        f = tmp_path / f"cut{cut}.rank0.json"
        f.write_text(text[:cut])
        with pytest.raises(ValueError):
            json.loads(text[:cut])
        lr = load_file(f, Strings())
        expect = sum(1 for e in ends if e <= cut)
        assert lr.recovered and len(lr.ts) == expect, (cut, len(lr.ts), expect)
        assert lr.rank == 0 and lr.meta["size"] == NP
        assert lr.lane_names[1] == "negotiate"
    # A file cut inside its header, and an empty one, load as empty ranks.
    for i, body in enumerate([text[:40], ""]):
        f = tmp_path / f"tiny{i}.rank1.json"
        f.write_text(body)
        lr = load_file(f, Strings())
        assert lr.recovered and len(lr.ts) == 0 and lr.rank == 1


def test_viewer_runs_on_a_cut_off_rank_file(trace, tmp_path, capsys):
    for r in range(NP):
        text = (trace.parent / f"timeline.rank{r}.json").read_text()
        cut = len(text) * 3 // 4 if r == 1 else len(text)
        (tmp_path / f"timeline.rank{r}.json").write_text(text[:cut])
    rc, out, _ = run_cli(capsys, tmp_path / "timeline.json", "--top", "3")
    assert rc == 0
    assert "rank 1" in out and "cut off" in out


def test_parse_text_handles_horovod_style_arrays():
    # Horovod's own timeline: a bare array, B/E pairs, never closed.
    doc, recovered = parse_text('[\n{"name": "a", "ph": "B", "ts": 1, "pid": 0, "tid": 1},\n'
                                '{"name": "a", "ph": "E", "ts": 5, "pid": 0, "tid": 1},\n')
    assert recovered and len(doc) == 2


def test_paths_base_directory_files_and_errors(trace, capsys):
    d = trace.parent
    want = [d / f"timeline.rank{r}.json" for r in range(NP)]
    assert discover([trace]) == want
    assert discover([d]) == want
    assert discover([d / "timeline"]) == want            # HOROVOD_TIMELINE without suffix
    assert discover([want[2], want[0]]) == [want[0], want[2]]
    rc, _, err = run_cli(capsys, d / "nothing.json")
    assert rc == 2 and "no timeline" in err


# ------------------------------------------------------------------------ analyses

def test_summary_names_the_delayed_rank(trace, capsys):
    rc, out, _ = run_cli(capsys, trace, "--top", "5")
    assert rc == 0
    lines = [l for l in out.splitlines() if l.strip()]
    # Title, then the answer.
    assert lines[1].startswith(f"rank {SLOW_RANK} was last to submit on "), out
    assert "it is the slow rank" in lines[1]
    rep = analyze_paths([trace])
    st = rep.stragglers
    assert st.verdict.slow_rank == SLOW_RANK
    slow = st.per_rank[SLOW_RANK]
    assert slow.share >= 0.9, out
    assert slow.mean_late_us >= 0.5 * SLEEP_S * 1e6, out
    assert {p.tensor for p in st.per_tensor} >= {"allreduce.grad.a", "allreduce.grad.b"}
    assert all(s.rank == SLOW_RANK for s in rep.top_rounds[:5])
    # Steps come from the engine's STEP marks; rank 2 is the worst in nearly all.
    assert rep.steps.source == "STEP marks" and len(rep.steps.steps) >= STEPS - 1
    assert rep.steps.worst_counts.get(SLOW_RANK, 0) >= len(rep.steps.steps) - 2
    # Where the time goes: the others wait, the slow rank idles.
    ph = rep.phases
    assert ph[0].waiting_us > ph[SLOW_RANK].waiting_us
    assert ph[SLOW_RANK].idle_us > ph[0].idle_us
    # Fusion and bytes are reported for the allreduces.
    ops = {b.op: b for b in rep.bytes}
    assert ops["ALLREDUCE"].bytes >= 2 * STEPS * 4096 * 4
    assert rep.fusion.ops and rep.fusion.ops[0].threshold > 0


def test_brief_is_the_title_and_the_answer_only(trace, capsys):
    rc, full, _ = run_cli(capsys, trace, "--top", "5")
    rc_brief, brief, _ = run_cli(capsys, trace, "--brief")
    assert rc == rc_brief == 0
    assert full.startswith(brief.rstrip("\n")), brief
    assert f"rank {SLOW_RANK} was last to submit" in brief
    assert len(brief.splitlines()) < len(full.splitlines()) // 2


def test_rank0_ready_us_stands_in_for_missing_files(trace):
    rep = analyze_paths([trace.parent / "timeline.rank0.json"])
    st = rep.stragglers
    assert rep.timeline.missing_ranks == list(range(1, NP))
    assert st.n >= 2 * STEPS and (st.source[st.complete] == 1).all()
    assert st.verdict.slow_rank == SLOW_RANK


# ----------------------------------------------------------------------- renderers

def test_png_is_written(trace, tmp_path, capsys):
    out = tmp_path / "lanes.png"
    rc, _, _ = run_cli(capsys, trace, "--png", out, "-q")
    assert rc == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image
    h, w = matplotlib.image.imread(str(out)).shape[:2]
    assert w > 800 and h > 300


def test_png_without_matplotlib_says_what_to_install(trace, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib fails
    out = tmp_path / "lanes.png"
    rc, _, err = run_cli(capsys, trace, "--png", out, "-q")
    assert rc == 2 and not out.exists()
    assert "--png needs matplotlib" in err and "horovodlike[viewer]" in err, err


def test_python_m_timeline_viewer_still_runs_from_the_checkout(trace):
    res = subprocess.run([sys.executable, "-m", "timeline_viewer", str(trace), "--brief"],
                         cwd=pathlib.Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "rank" in res.stdout, res.stderr


def test_merged_trace_loads_with_one_pid_per_rank(trace, tmp_path, capsys):
    out = tmp_path / "merged.json"
    text_out = tmp_path / "summary.txt"
    rc, stdout, _ = run_cli(capsys, trace, "--merged", out, "--text", text_out)
    assert rc == 0 and stdout == ""
    assert text_out.read_text().splitlines()[2].startswith(f"rank {SLOW_RANK} was last")
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    assert {e["pid"] for e in evs} == set(range(NP))
    names = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert all(names[r].startswith(f"rank {r}") for r in range(NP))
    n_in = sum(sum(1 for e in json.loads((trace.parent / f"timeline.rank{r}.json")
                                         .read_text())["traceEvents"] if e["ph"] != "M")
               for r in range(NP))
    assert sum(1 for e in evs if e["ph"] != "M") == n_in
    # One axis: the same round's responses reach every rank at about the same time.
    ends = {}
    for e in evs:
        if e["name"] == "NEGOTIATE_ALLREDUCE" and e["args"]["tensor"] == "allreduce.grad.a":
            ends.setdefault(e["pid"], []).append(e["ts"] + e["dur"])
    for r in range(1, NP):
        assert len(ends[r]) == len(ends[0]) == STEPS
        assert max(abs(a - b) for a, b in zip(sorted(ends[0]), sorted(ends[r]))) < 20_000


# -------------------------------------------------------------------- HTML / browser

def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


# Appended to a copy of the page: drives zoom, pan and the tooltip like a user would,
# and writes what happened into the DOM for --dump-dom.
PROBE = r"""<script>
(function () {
  var out = [];
  try {
    var c = document.getElementById("tv-canvas"), r = c.getBoundingClientRect();
    var v0 = c.getAttribute("data-view");
    c.dispatchEvent(new WheelEvent("wheel", {deltaY: -400, clientX: r.left + r.width / 2,
      clientY: r.top + 8, bubbles: true, cancelable: true}));
    var v1 = c.getAttribute("data-view");
    out.push("zoom=" + (v0 !== v1));
    c.dispatchEvent(new MouseEvent("mousedown", {clientX: r.left + 100, clientY: r.top + 8, bubbles: true}));
    window.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + 260, clientY: r.top + 8, bubbles: true}));
    window.dispatchEvent(new MouseEvent("mouseup", {bubbles: true}));
    out.push("pan=" + (c.getAttribute("data-view") !== v1));
    c.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
    out.push("reset=" + (c.getAttribute("data-view") === v0));
    var tip = document.getElementById("tv-tip"), text = "";
    for (var x = 1; x < r.width && !text; x += 2) {
      c.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + x, clientY: r.top + 8, bubbles: true}));
      if (tip.style.display === "block") { text = tip.textContent; }
    }
    out.push("tip=" + text.replace(/\s+/g, " "));
  } catch (e) { out.push("probe-error=" + e); }
  document.body.setAttribute("data-probe", out.join(";;"));
}());
</script>"""

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,900"]


def _chrome(exe, tmp_path, url, *extra):
    prof = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    return subprocess.run([exe, *CHROME_FLAGS, f"--user-data-dir={prof}", *extra, url],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_html_is_self_contained_and_renders_in_headless_chromium(trace, tmp_path, capsys):
    page = tmp_path / "timeline.html"
    rc, _, _ = run_cli(capsys, trace, "--html", page, "-q")
    assert rc == 0
    html = page.read_text()
    urls = [u for u in re.findall(r"https?://[^\s\"'<>)]*", html)
            if u != "http://www.w3.org/2000/svg"]
    assert not urls, urls
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b|@import|url\(", html)
    for r in range(NP):
        assert f"rank {r}" in html

    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH: install it (Debian: apt-get install -y chromium) "
                    "to check the page in a browser")

    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    res = _chrome(exe, tmp_path, probe.as_uri(), "--enable-logging=stderr", "--v=0",
                  "--dump-dom")
    dom, log = res.stdout, res.stderr
    assert 'data-rendered="yes"' in dom, log[-3000:]
    console = [l for l in log.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not [l for l in console if "Uncaught" in l or "Content Security Policy" in l
                or "rror" in l], console
    for r in range(NP):
        labels = re.findall(rf'<div class="lane-label[^"]*"[^>]*data-rank="{r}"[^>]*>'
                            rf'(rank {r} [^<]*)</div>', dom)
        assert any("negotiate" in l for l in labels), (r, labels)
        assert any("collective" in l for l in labels), (r, labels)
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-2000:]
    probe_out = dict(p.split("=", 1) for p in m.group(1).split(";;"))
    assert probe_out == {**probe_out, "zoom": "true", "pan": "true", "reset": "true"}, probe_out
    assert "NEGOTIATE_" in probe_out["tip"] and "rank 0" in probe_out["tip"], probe_out

    shot = tmp_path / "shot.png"
    res = _chrome(exe, tmp_path, page.as_uri(), f"--screenshot={shot}")
    assert shot.exists(), res.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image
    img = matplotlib.image.imread(str(shot))
    assert img.shape[1] >= 1000 and img.shape[0] >= 600
    assert img[..., :3].std() > 0.05          # not a blank page


def test_page_carries_the_static_script_and_style_and_the_wheel_ships_them(trace, tmp_path,
                                                                          capsys):
    import ast
    import fnmatch
    import pathlib
    page = tmp_path / "timeline.html"
    assert run_cli(capsys, trace, "--html", page, "-q")[0] == 0
    html = page.read_text()
    static = pathlib.Path(timeline_viewer.__file__).parent / "static"
    for name in ("viewer.js", "viewer.css"):
        text = (static / name).read_text()
        assert len(text) > 500 and text in html, name
    # Every file of static/ is package data in setup.py, so an installed viewer has it.
    setup = (pathlib.Path(__file__).parent.parent / "setup.py").read_text()
    call = next(n for n in ast.walk(ast.parse(setup))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    data = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))
    for f in static.iterdir():
        assert any(fnmatch.fnmatch(f"static/{f.name}", pat)
                   for pat in data["horovodlike.timeline_viewer"]), f.name


def test_one_string_interner():
    s = Strings()
    assert [s.intern(x) for x in ("a", "b", "a")] == [0, 1, 0]
    assert s.names == ["a", "b"] and s.id("b") == 1 and s.id("c") == -1


# ------------------------------------------------------- verdicts, colours, headline

def _write_trace(d, late_us, n=20, jitter_us=5.0):
    """A saved 2-rank trace of n allreduces 1 ms apart: rank 1 submits each late_us
    after rank 0; the response reaches both within jitter_us of each other."""
    rng = __import__("random").Random(1)
    for r in range(2):
        events = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}},
                  {"name": "thread_name", "ph": "M", "pid": r, "tid": 1,
                   "args": {"name": "negotiate"}}]
        for i in range(n):
            t0 = 1000.0 + 1000.0 * i
            end = t0 + late_us + 20.0 + (rng.uniform(-jitter_us, jitter_us) if r else 0.0)
            start = t0 + (late_us if r == 1 else 0.0)
            events.append({"name": "NEGOTIATE_ALLREDUCE", "ph": "X", "pid": r, "tid": 1,
                           "ts": start, "dur": end - start,
                           "args": {"tensor": f"allreduce.g{i % 4}", "bytes": 16}})
        (d / f"timeline.rank{r}.json").write_text(json.dumps({
            "otherData": {"rank": r, "size": 2, "hostname": "h", "clock_offset_us": 0.0,
                          "engine": "horovodlike"}, "traceEvents": events}))
    return d / "timeline.json"


def test_no_straggler_verdict_under_the_traces_noise_floor(tmp_path):
    # 0.09 ms on every one of 20 ops: under one cross-process wake-up, not a straggler.
    st = analyze_paths([_write_trace(tmp_path, 90.0)]).stragglers
    assert st.verdict.slow_rank is None, st.verdict.sentence
    assert st.verdict.sentence.startswith("no rank stands out"), st.verdict.sentence
    assert "noise floor" in st.verdict.sentence
    # 2 ms late on every op is well above it: rank 1 is named.
    (tmp_path / "late").mkdir()
    st = analyze_paths([_write_trace(tmp_path / "late", 2000.0)]).stragglers
    assert st.verdict.slow_rank == 1, st.verdict.sentence


def test_every_negotiate_phase_has_a_colour_of_its_own():
    from horovodlike.timeline_viewer import style
    ops = ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER",
           "JOIN"]
    phases = {style.color_for(f"NEGOTIATE_{op}") for op in ops}
    assert len(phases) == len(ops), phases
    # ... and none looks like a data-movement entry of the legend
    others = {style.color_for(n) for n in [*ops, "QUEUE", "MEMCPY_IN_FUSION_BUFFER",
                                           "ERROR", "STEP", "SHM_ONE_SHOT", "RING_PHASE"]}
    assert not phases & others, phases & others


def test_png_headline_is_whole_and_fits_the_lanes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.text import Text
    from horovodlike.timeline_viewer.render_png import render_png
    rep = analyze_paths([_write_trace(tmp_path, 2000.0)])
    long = ("rank 1 was last to submit on 100% of tensors, on average 2.00 ms late and "
            "caused 100% of the waiting; it is the slow rank, " * 3).strip()
    rep.stragglers.verdict.sentence = long
    seen = {}
    save = Figure.savefig

    def keep(fig, *a, **k):
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        seen["text"] = ax.get_title(loc="left")
        title, = [t for t in fig.findobj(Text) if t.get_text() == seen["text"]]
        seen["fits"] = title.get_window_extent(renderer).width <= \
            ax.get_window_extent(renderer).width + 1
        return save(fig, *a, **k)
    monkeypatch.setattr(Figure, "savefig", keep)
    render_png(rep, str(tmp_path / "out.png"))
    assert " ".join(seen["text"].split()) == long, seen["text"]       # nothing cut
    assert seen["fits"], seen["text"]

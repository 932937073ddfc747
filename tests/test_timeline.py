"""The engine's traces, produced by real multi-rank runs: every rank's file parses with
json.loads while the job runs and after a rank is killed; events nest and are ordered as
documented; start/stop_timeline restart with a new path; the size cap and the step
window hold."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from harness import HOROVODLIKERUN, REPO, rank_program, run_ranks

LOOP = rank_program("timeline_loop")


def rank_files(base, n):
    stem, ext = os.path.splitext(str(base))
    return [f"{stem}.rank{r}{ext}" for r in range(n)]


def load(path):
    """Read as the docs tell a live reader to: under a shared flock, so no write is
    half-seen."""
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        return json.loads(f.read())


@pytest.mark.timeout(180)
def test_traces_parse_while_the_job_runs_and_after_a_kill(tmp_path):
    script = LOOP
    base = tmp_path / "timeline.json"
    # The job runs until the kill ends it (a fixed few seconds raced the parsing: the
    # faster the engine, the larger the files and the slower each parse). The files are
    # capped at 8 MB: an unloaded run kills rank 2 well below it, and on a loaded host,
    # where the ranks may start late and then write for many seconds, a parse still
    # takes a fraction of a second (uncapped, 30 parses of growing files once outlasted
    # the 60 s job), and the truncated file is parsed too.
    env = dict(os.environ, HOROVOD_TIMELINE=str(base), PYTHONPATH=str(REPO),
               HOROVOD_TIMELINE_MAX_MB="8")
    proc = subprocess.Popen([HOROVODLIKERUN, "-np", "3", sys.executable, str(script), "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    parsed, killed = 0, False
    try:
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 90:
            for path in rank_files(base, 3):
                if os.path.exists(path):
                    doc = load(path)            # must never fail, at any moment
                    assert "traceEvents" in doc and doc["otherData"]["size"] == 3
                    parsed += 1
            if not killed and time.monotonic() - t0 > 3 and parsed > 30:
                # kill -9 rank 2's process; its file must still parse
                out = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
                pids = sorted(int(p) for p in out.stdout.split())
                victim = [p for p in pids if "HOROVOD_RANK=2\0" in
                          open(f"/proc/{p}/environ").read()]
                if victim:
                    os.kill(victim[0], signal.SIGKILL)
                    killed = True
            time.sleep(0.05)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert killed and parsed > 30
    for path in rank_files(base, 3):
        doc = load(path)
        assert any(e["name"] == "ALLREDUCE" for e in doc["traceEvents"]), path


NESTED = rank_program("timeline_nested")


def spans(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


@pytest.mark.timeout(120)
def test_events_nest_and_are_ordered(tmp_path):
    base = tmp_path / "t.json"
    run_ranks(NESTED, np=3, env={"HOROVOD_TIMELINE": str(base),
                                 "HOROVOD_TIMELINE_MARK_CYCLES": "1"}).assert_ok()
    for r, path in enumerate(rank_files(base, 3)):
        doc = load(path)
        ev = doc["traceEvents"]
        meta = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
        assert meta == {1: "negotiate", 2: "queue", 3: "memcpy", 4: "collective",
                        5: "algorithm", 6: "cycles", 7: "p2p"}
        assert all(e["pid"] == r for e in ev)
        assert any(e["name"] == "CYCLE_START" for e in ev)
        assert any(e["name"] == "STEP" for e in ev)
        assert any(e["name"] == "ERROR" and e["args"]["tensor"] == "allreduce.bad" for e in ev)
        xs = spans(doc)
        neg = {e["args"]["tensor"]: e for e in xs if e["name"] == "NEGOTIATE_ALLREDUCE"}
        queue = defaultdict(list)
        for e in xs:
            if e["name"] == "QUEUE":
                queue[e["args"]["tensor"]].append(e)
        colls = [e for e in xs if e["tid"] == 4]
        assert {e["name"] for e in colls} >= {"ALLREDUCE", "ALLGATHER", "BROADCAST"}
        # the collective lane never overlaps itself
        colls.sort(key=lambda e: e["ts"])
        for a, b in zip(colls, colls[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 0.2, (a, b)
        # NEGOTIATE ends where QUEUE starts; QUEUE ends where the collective starts
        for c in colls:
            for t in c["args"]["tensors"]:
                q = [e for e in queue[t] if abs(e["ts"] + e["dur"] - c["ts"]) < 1.0]
                assert q, (t, c)
        for t, n in neg.items():
            assert any(abs(n["ts"] + n["dur"] - q["ts"]) < 1.0 for q in queue[t]), t
        # fused allreduces carry their tensors; memcpy and ring steps sit inside them
        fused = [c for c in colls if c["name"] == "ALLREDUCE" and c["args"]["fused"] > 1]
        assert fused, "8 async allreduces per step should fuse"
        inner = [e for e in xs if e["tid"] in (3, 5)]
        for e in inner:
            assert any(c["ts"] - 0.2 <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 0.2
                       for c in colls), e
        if r == 0:
            assert all(len(n["args"]["ready_us"]) == 3 for n in neg.values())
    # Horovod's tools open exactly HOROVOD_TIMELINE: there sits rank 0's trace.
    assert os.path.samefile(base, rank_files(base, 3)[0])


RESTART = rank_program("timeline_restart")


@pytest.mark.timeout(120)
def test_start_stop_timeline_restarts_with_a_new_path(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run_ranks(RESTART, np=2, args=(str(a), str(b))).assert_ok()
    for path_a, path_b in zip(rank_files(a, 2), rank_files(b, 2)):
        ta = json.dumps(load(path_a))
        tb = json.dumps(load(path_b))
        assert "allreduce.first" in ta and "allreduce.second" not in ta
        assert "allreduce.second" in tb and "allreduce.first" not in tb
        assert "untraced" not in ta + tb
        assert "CYCLE_START" in tb and "CYCLE_START" not in ta


@pytest.mark.timeout(120)
def test_size_cap_and_step_window(tmp_path):
    capped, window = tmp_path / "cap.json", tmp_path / "win.json"
    script = LOOP
    run_ranks(str(script), np=2, args=("2",), env={"HOROVOD_TIMELINE": str(capped),
                                                   "HOROVOD_TIMELINE_MAX_MB": "0.02"})
    for path in rank_files(capped, 2):
        doc = load(path)
        assert doc["traceEvents"][-1]["name"] == "TIMELINE_TRUNCATED"
        assert os.path.getsize(path) < 0.02 * 1024 * 1024 + 4096
    run_ranks(str(script), np=2, args=("2",), env={"HOROVOD_TIMELINE": str(window),
                                                   "HOROVOD_TIMELINE_START_STEP": "3",
                                                   "HOROVOD_TIMELINE_STOP_STEP": "5"})
    for path in rank_files(window, 2):
        steps = [e["args"]["step"] for e in load(path)["traceEvents"] if e["name"] == "STEP"]
        assert steps == [3, 4], steps


def test_no_trace_without_the_variable(tmp_path):
    run_ranks(rank_program("one_allreduce"), np=2, cwd=str(tmp_path)).assert_ok()
    assert not list(tmp_path.glob("*.json"))


BACK_TO_BACK = rank_program("timeline_back_to_back")


@pytest.mark.timeout(120)
def test_fused_in_place_tensors_back_to_back_in_one_buffer_are_not_copied(tmp_path):
    """The sharded optimizer all-reduces the gradient shards of consecutive buckets, in
    place; they lie back to back in one buffer, so a fused allreduce of them reduces
    that buffer where it is, without the fusion buffer's two copies (which tensors
    apart still need)."""
    base = tmp_path / "t.json"
    res = run_ranks(BACK_TO_BACK, np=2, env={"HOROVOD_TIMELINE": str(base),
                                             "HOROVODLIKE_ALLREDUCE_ALGORITHM": "ring",
                                             "HOROVOD_CYCLE_TIME": "20"})
    res.assert_ok()
    for path in rank_files(base, 2):
        xs = spans(load(path))
        fused = [c for c in xs if c["name"] == "ALLREDUCE" and c["args"]["fused"] > 1]
        views = [c for c in fused if all("view" in t for t in c["args"]["tensors"])]
        apart = [c for c in fused if all("apart" in t for t in c["args"]["tensors"])]
        assert views and apart, [c["args"]["tensors"] for c in fused]
        copies = [e for e in xs if e["tid"] == 3]

        def copied(c):
            return [e for e in copies if c["ts"] - 0.2 <= e["ts"] <= c["ts"] + c["dur"] + 0.2]
        assert all(copied(c) for c in apart), "fused tensors apart go through the fusion buffer"
        assert not any(copied(c) for c in views), [copied(c) for c in views]

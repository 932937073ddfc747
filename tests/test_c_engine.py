"""The engine's own C tests (tests/c): the frame codecs against hostile bytes (the control
frames, test_frames.c; the point-to-point frames, test_p2p_frames.c), then several
engines as threads in one process, every collective and algorithm at 1 to 16 ranks
against a reference, each world checked to run the algorithm it was built for (as the engine traced it), then the failure paths:
every injection site, a peer dying mid-frame, a bad control frame (see
tests/c/test_engine.c). Built here with the system C compiler and the engine's flags,
three times: plain; with AddressSanitizer + UndefinedBehaviorSanitizer (leak checking
on: the C tests free everything they make); and with ThreadSanitizer, which checks the
threading rules of engine/core/engine.h: callers, the loop, a caller driving the loop's
work (the tests' blocking calls do, on one node) and the p2p thread, 1 to 16 engines at
once. Any report fails the run; tests/c/tsan.supp holds the suppressions, each with the
proof that its race is benign (none today). TSan sees races in the process's own memory:
each engine maps its node's segment at its own address, so accesses to the segment's
data by two engines are not compared (the segment orders them by atomics and futexes).
Binaries go to a scratch directory."""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess

import pytest
from harness import leaked_segments, segments

from horovodlike._build_engine import (COMPILE_FLAGS, SANITIZE_FLAGS, engine_include_dirs,
                                       engine_sources)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTESTS = os.path.join(ROOT, "tests", "c")
CC = os.environ.get("CC", "cc")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which(CC) is None, reason=f"no C compiler ({CC})"),
]


def _build(out_dir, extra):
    """Compile every engine and test source (two at a time: the machine may be small)
    and link engine_tests; returns its path."""
    sources = engine_sources() + sorted(glob.glob(os.path.join(CTESTS, "*.c")))
    flags = (COMPILE_FLAGS + ["-pthread"] + ["-I" + d for d in engine_include_dirs()] +
             ["-I" + CTESTS] + extra)
    if extra:   # a checking build: -O1 compiles twice as fast and keeps the reports exact
        flags = [f for f in flags if not f.startswith("-O")] + ["-O1"]

    def compile_one(src):
        obj = os.path.join(out_dir, os.path.basename(os.path.dirname(src)) + "_" +
                           os.path.basename(src)[:-2] + ".o")
        res = subprocess.run([CC, "-c", src, "-o", obj] + flags, capture_output=True, text=True)
        assert res.returncode == 0, f"{src} does not compile:\n{res.stderr[-4000:]}"
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        objs = list(pool.map(compile_one, sources))
    exe = os.path.join(out_dir, "engine_tests")
    res = subprocess.run([CC, "-o", exe] + objs + ["-pthread"] + extra, capture_output=True, text=True)
    assert res.returncode == 0, f"engine_tests does not link:\n{res.stderr[-4000:]}"
    return exe


def _can_disable_aslr():
    """setarch -R needs the personality call, which some containers refuse."""
    if not shutil.which("setarch"):
        return False
    return subprocess.run(["setarch", os.uname().machine, "-R", "true"],
                          capture_output=True).returncode == 0


# ThreadSanitizer, on its own (it cannot be mixed with ASan). -O1 comes from _build.
TSAN_FLAGS = ["-fsanitize=thread", "-g"]
TSAN_SUPPRESSIONS = os.path.join(CTESTS, "tsan.supp")
BUILDS = {"plain": [], "asan_ubsan": SANITIZE_FLAGS, "tsan": TSAN_FLAGS}


@pytest.mark.parametrize("build", list(BUILDS))
def test_c_engine(tmp_path, build):
    if build != "plain" and os.environ.get("HOROVODLIKE_TEST_SANITIZED"):
        pytest.skip("already the sanitizer run")
    exe = _build(str(tmp_path), BUILDS[build])
    env = dict(os.environ)
    # Engines read their settings at creation; the tests set their own, so none leak in.
    for k in list(env):
        if k.startswith(("HOROVOD_", "HOROVODLIKE_")):
            del env[k]
    env.pop("LD_PRELOAD", None)
    # INFO: each engine logs its settings at start, so the lines' ranks can be checked.
    env["HOROVOD_LOG_LEVEL"] = "INFO"
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    # The first report ends the run with its own exit status; a deadlock report names
    # both lock sites. Without ASLR (setarch -R) the runtime's memory layout is the same
    # every run, and it cannot collide with a kernel's high-entropy mmap placement.
    env["TSAN_OPTIONS"] = (f"halt_on_error=1 exitcode=66 second_deadlock_stack=1 "
                           f"suppressions={TSAN_SUPPRESSIONS}")
    cmd = [exe]
    if build == "tsan" and _can_disable_aslr():
        cmd = ["setarch", os.uname().machine, "-R", exe]
    before = segments()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=240, cwd=str(tmp_path))
    finally:
        for seg in leaked_segments(before):      # only if a run died mid start-up
            try:
                os.unlink(seg)
            except OSError:
                pass
    out = res.stdout + res.stderr
    assert "WARNING: ThreadSanitizer" not in out, out[-12000:]
    assert res.returncode == 0, f"engine_tests exited {res.returncode}:\n{out[-8000:]}"
    assert "all checks passed" in res.stdout, out[-8000:]
    # Every world ran (and checked) the algorithm it was built for, and every failure path ran.
    for line in ("one node, shm, 16 ranks", "one node, tcp only, 16 ranks", "2 nodes x 2",
                 "every injection site, in-process", "a peer dies mid-frame", "a peer sends a bad frame"):
        assert line in res.stdout, out[-4000:]
    assert "hierarchical" in res.stdout and " shm " in res.stdout, res.stdout
    assert "small control frames" in res.stdout, res.stdout
    assert "point-to-point frames" in res.stdout, res.stdout
    # Each engine logs as its own rank, though the process holds up to 16 of them.
    config_lines = re.findall(r"\[horovodlike rank (-?\d+)\] INFO: rank (\d+) config:", res.stderr)
    assert len(config_lines) >= 16, res.stderr[-4000:]
    wrong = [(a, b) for a, b in config_lines if a != b]
    assert not wrong, f"log lines prefixed with another engine's rank (prefix, own): {wrong[:8]}"

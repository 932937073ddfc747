"""The engine's own C tests (tests/c): several engines as threads in one process, every
collective and algorithm at 1 to 16 ranks against a reference, each world checked to
run the algorithm it was built for (as the engine traced it), then the failure paths:
every injection site, a peer dying mid-frame, a bad control frame (see
tests/c/test_engine.c). Built here with the system C compiler and the engine's flags,
once plain and once with AddressSanitizer + UndefinedBehaviorSanitizer (leak checking
on: the C tests free everything they make). Binaries go to a scratch directory."""
import concurrent.futures
import glob
import os
import shutil
import subprocess

import pytest

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


def _shm_segments():
    return set(glob.glob("/dev/shm/hvdl-*"))


@pytest.mark.parametrize("sanitized", [False, True], ids=["plain", "asan_ubsan"])
def test_c_engine(tmp_path, sanitized):
    if sanitized and os.environ.get("HOROVODLIKE_TEST_SANITIZED"):
        pytest.skip("already the sanitizer run")
    exe = _build(str(tmp_path), SANITIZE_FLAGS if sanitized else [])
    env = dict(os.environ)
    # Engines read their settings at creation; the tests set their own, so none leak in.
    for k in list(env):
        if k.startswith(("HOROVOD_", "HOROVODLIKE_")):
            del env[k]
    env.pop("LD_PRELOAD", None)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    before = _shm_segments()
    try:
        res = subprocess.run([exe], capture_output=True, text=True, env=env,
                             timeout=240, cwd=str(tmp_path))
    finally:
        for seg in _shm_segments() - before:      # only if a run died mid start-up
            try:
                os.unlink(seg)
            except OSError:
                pass
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"engine_tests exited {res.returncode}:\n{out[-8000:]}"
    assert "all checks passed" in res.stdout, out[-8000:]
    # Every world ran (and checked) the algorithm it was built for, and every failure path ran.
    for line in ("one node, shm, 16 ranks", "one node, tcp only, 16 ranks", "2 nodes x 2",
                 "every injection site, in-process", "a peer dies mid-frame", "a peer sends a bad frame"):
        assert line in res.stdout, out[-4000:]
    assert "hierarchical" in res.stdout and " shm " in res.stdout, res.stdout
    assert "small control frames" in res.stdout, res.stdout

"""Injected failures (HOROVODLIKE_TEST_INJECT, for testing only): each named site in the
engine fails for real on one rank, and every rank of the job must report that cause (the
rank, the site's own reason, and that it was injected), the job must end without a hang,
and no shared-memory segment may be left behind.

The segment's name is the engine's own answer, not recomputed here: every rank that got
through init prints the /dev/shm file it has mapped (read from /proc/self/maps), and a
rank whose init failed while setting the segment up names it in its error. The job runs
on a made-up host name of its own (two, for the cases that need two nodes: hierarchical
negotiation and algorithms), which the failure messages must name.

test_every_allocation_has_a_site_or_a_reason reads the engine's sources: every
malloc/calloc/realloc/strdup must sit next to an injection site in its function, or
its function must be listed, with the reason, in engine/core/inject.c's audit."""
import os
import re
import uuid

import pytest

from harness import rank_program, run_ranks

NP = 3

SCRIPT = rank_program("engine_inject_op")

# A case's environment with this key runs on two made-up nodes of two ranks each; with
# _NTH, the site fails at that visit of the rank rather than its first.
NODES = {"_NODES": "2"}

# Every site the engine has (its own list, so that a new site without a case fails
# test_every_engine_site_has_a_case) -> the failures caused there: failing rank, extra
# environment, op, the site's own reason.
SITE_CASES = {
    "ring_alloc": [(1, {"HOROVODLIKE_SHM": "0"}, "big_allreduce",
                    "out of memory for a 262144-byte ring staging buffer")],
    "rd_alloc": [(2, {"HOROVODLIKE_SHM": "0"}, "small_allreduce", "recursive-doubling scratch buffer")],
    "tcp_send": [(1, {"HOROVODLIKE_SHM": "0"}, "big_allreduce", "sending data to rank 2 failed")],
    "shm_attach": [(1, {}, "init", "could not set up the shared-memory segment"),
                   (0, {}, "init", "could not set up the shared-memory segment")],
    "ctrl_send": [(2, {}, "small_allreduce", "sending a control frame to rank 0 failed"),
                  (0, {}, "small_allreduce", "sending a control frame to rank")],
    "fusion_alloc": [(0, {"HOROVODLIKE_SHM": "0", "HOROVOD_CYCLE_TIME": "20"}, "fused", "out of memory for a")],
    "output_alloc": [(2, {}, "allgather", "out of memory for a 72-byte allgather result")],
    "plan_alloc": [(0, {}, "small_allreduce", "out of memory for a")],
    "scatter_alloc": [(1, {"HOROVODLIKE_SHM": "0"}, "reducescatter",
                       "out of memory for a 48-byte reducescatter buffer")],
    # Out of memory while decoding a frame is the decoding rank's failure, never the
    # sender's malformed frame: rank 0 decodes request lists, workers response lists.
    "decode_alloc": [(0, {}, "small_allreduce", "-byte request list"),
                     (1, {}, "small_allreduce", "-byte response list")],
    "frame_alloc": [(2, {}, "small_allreduce", "-byte control frame")],
    "exec_alloc": [(1, {}, "small_allreduce", "-byte table of a response's tensors")],
    "cache_alloc": [(1, {}, "small_allreduce", "-byte response-cache entry"),
                    (0, {}, "small_allreduce", "-byte response-cache entry")],
    "announce_alloc": [(1, {}, "small_allreduce", "-byte request bit vector")],
    "record_alloc": [(0, {}, "small_allreduce", "-byte request record")],
    # rank 0 plans a response; a worker turns the segment's log entry into one
    "response_alloc": [(0, {"HOROVODLIKE_SHM": "0"}, "small_allreduce", "-byte response"),
                       (1, {}, "repeated", "-byte response")],
    "plan_frame_alloc": [(0, {"HOROVODLIKE_SHM": "0"}, "small_allreduce", "-byte table of response frames")],
    "took_alloc": [(0, {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"}, "stalled",
                    "-byte requests taken over from the segment")],
    "log_alloc": [(1, {}, "repeated", "-byte response queue")],
    "nodes_alloc": [(0, NODES, "changed", "-byte record of the nodes' closed words")],
    "deadlock_alloc": [(2, {}, "small_allreduce", "-byte deadlock state")],
    "hier_alloc": [(1, NODES, "allgather", "-byte hierarchical allgather buffer"),
                   (2, NODES, "big_allreduce", "-byte hierarchical share buffer")],
    # a worker blocked for 2 s reports what it waits for; rank 0 reads the report
    "wait_alloc": [(0, {}, "stalled", "-byte wait report")],
    # start-up once connected: its first visit, then its second (_NTH)
    "start_alloc": [(1, {}, "init", "-byte table of the job's nodes"),
                    (2, {"_NTH": "2"}, "init", "-byte point-to-point state")],
}


def _engine_sites():
    from horovodlike._engine import ffi, lib
    sites, i = [], 1
    while lib.hvdl_inject_site(i) != ffi.NULL:
        sites.append(ffi.string(lib.hvdl_inject_site(i)).decode())
        i += 1
    return sites


ENGINE_SITES = _engine_sites()
# site, failing rank, extra environment, op, the site's own reason
CASES = [(site,) + case for site in ENGINE_SITES for case in SITE_CASES.get(site, [])]


def test_every_engine_site_has_a_case():
    assert ENGINE_SITES and set(ENGINE_SITES) == set(SITE_CASES), \
        f"the engine's sites {sorted(ENGINE_SITES)} and the cases here {sorted(SITE_CASES)} differ"


_SEGMENT_IN_MESSAGE = re.compile(r"shared-memory segment (/hvdl-[0-9a-f]+-[0-9a-f]+) ")


def segments_named_by_the_engine(res):
    """/dev/shm paths of the job's segment, as the ranks reported them: mapped after init,
    or named in an error from setting it up."""
    paths = set()
    for lines in res.rank_lines().values():
        for line in lines:
            if line.startswith("SEGMENT "):
                paths.add(line.split(" ", 1)[1])
            paths.update("/dev/shm" + m for m in _SEGMENT_IN_MESSAGE.findall(line))
    return paths


@pytest.mark.parametrize("site,victim,env,op,reason", CASES, ids=[f"{c[0]}@{c[1]}" for c in CASES])
def test_injected_failure_names_its_cause_on_every_rank(site, victim, env, op, reason):
    host = f"inj{uuid.uuid4().hex[:8]}"
    env = dict(env, HVDTEST_OP=op, HOROVODLIKE_PEER_TIMEOUT_SECONDS="20")
    nth = env.pop("_NTH", None)
    env["HOROVODLIKE_TEST_INJECT"] = f"{site}:{victim}" + (f":{nth}" if nth else "")
    if env.pop("_NODES", None):
        np_, hosts = 4, [host + "a", host + "b"]
        spec, victim_host = f"{hosts[0]}:2,{hosts[1]}:2", hosts[victim // 2]
    else:
        np_, hosts = NP, [host]
        spec, victim_host = f"{host}:{NP}", host
    res = run_ranks(SCRIPT, np_, env=env, timeout=90,
                    launcher_args=["-H", spec, "--ssh-command", "sh -c {command}"])
    lines = res.rank_lines()
    for r in range(np_):
        errs = [l for l in lines.get(r, []) if l.startswith("ERR ")]
        assert errs, f"rank {r} reported no error\n{res.describe()}"
        msg = errs[0]
        assert f"rank {victim} (host {victim_host}) failed: " in msg, f"rank {r}: {msg}\n{res.describe()}"
        assert reason in msg, f"rank {r} does not name the cause: {msg}"
        assert f"(injected by HOROVODLIKE_TEST_INJECT={site})" in msg, f"rank {r}: {msg}"
    assert res.elapsed < 60, res.describe()
    segments = segments_named_by_the_engine(res)
    if env.get("HOROVODLIKE_SHM") == "0":
        assert not segments, f"the engine used a segment with HOROVODLIKE_SHM=0: {segments}"
    else:
        # one segment per host, and some rank must have named each, or the check below
        # would pass on nothing (a failure in start-up may come before the segment exists)
        if op != "init" or site == "shm_attach":
            assert len(segments) == len(hosts), f"ranks named segments {segments}\n{res.describe()}"
        left = [p for p in segments if os.path.exists(p)]
        assert not left, f"shared-memory segment left behind: {left}"


def test_malformed_spec_is_refused_loudly():
    res = run_ranks(SCRIPT, 2, env={"HOROVODLIKE_TEST_INJECT": "no_such_site:1",
                                   "HVDTEST_OP": "small_allreduce"}, timeout=60)
    assert "is not site[:rank[:nth]] with a known site" in res.stderr, res.describe()
    res.assert_ok(sentinel="NOERROR")


def test_nth_visit_and_other_ranks_untouched():
    """ring_alloc:0:2 fails rank 0 on its second ring allreduce, not the first."""
    res = run_ranks(SCRIPT, NP, timeout=90,
                    env={"HOROVODLIKE_TEST_INJECT": "ring_alloc:0:2", "HOROVODLIKE_SHM": "0",
                         "HVDTEST_OP": "big_allreduce"})
    lines = res.rank_lines()
    for r in range(NP):
        errs = [l for l in lines.get(r, []) if l.startswith("ERR ")]
        assert "OP_OK" in lines.get(r, []), f"rank {r}: the first visit failed\n{res.describe()}"
        assert errs and "rank 0 (host" in errs[0] and "ring staging buffer" in errs[0], res.describe()


ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine")
ALLOC = re.compile(r"\b(malloc|calloc|realloc|strdup)\s*\(")
SITE = re.compile(r"\bHVDL_(CTX_)?INJECT\s*\(")
NEAR = 12     # lines: a site this close, in the same function, guards the allocation


def _allocations():
    """Every allocation call in the engine's C sources: (file relative to engine/,
    function, line number, whether a site is within NEAR lines of it in its function)."""
    found = []
    for root, _, files in os.walk(ENGINE):
        for f in sorted(files):
            if not f.endswith(".c"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, ENGINE)
            with open(path) as fh:
                text = fh.read()
            text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
            text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
            lines = text.split("\n")
            func, start = None, 0
            for i, line in enumerate(lines):
                # a definition starts at column 0 (a declaration ends with its ';')
                m = re.match(r"^[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(", line)
                if m and not line.rstrip().endswith(";") and not line.startswith(("typedef", "struct", "enum")):
                    func, start = m.group(1), i
                if ALLOC.search(line):
                    lo = max(start, i - NEAR)
                    near = any(SITE.search(l) for l in lines[lo:i + NEAR + 1])
                    found.append((rel, func, i + 1, near))
    return found


def _audit():
    """inject.c's audit: {(file, function): reason} from its lines `file: functions: why`."""
    with open(os.path.join(ENGINE, "core", "inject.c")) as fh:
        text = fh.read()
    block = text[text.index("AUDIT:"):text.index("END AUDIT")]
    listed = {}
    for m in re.finditer(r"^ \*\s+(\S+\.c): ([\w ]+): (.+)$", block, flags=re.M):
        for fn in m.group(2).split():
            listed[(m.group(1), fn)] = m.group(3)
    return listed


def test_every_allocation_has_a_site_or_a_reason():
    """An allocation with neither a site beside it nor a reason in the audit fails here,
    and so does an audit entry that no longer names an allocation."""
    allocs, listed = _allocations(), _audit()
    assert len(allocs) > 50, "the engine's allocations were not found"
    missing = [f"{f}:{ln} in {fn}()" for f, fn, ln, near in allocs if not near and (f, fn) not in listed]
    assert not missing, ("allocations without an injection site (HVDL_INJECT within "
                         f"{NEAR} lines) or a reason in engine/core/inject.c's audit: {missing}")
    unguarded = {(f, fn) for f, fn, _, near in allocs if not near}
    stale = sorted(k for k in listed if k not in unguarded)
    assert not stale, f"the audit lists functions without an unguarded allocation: {stale}"

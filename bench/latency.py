"""Small-op latency as the ranks see it: N rounds of (barrier, one allreduce), or a stream
of barriers alone, with each rank's own clock readings gathered to rank 0.

    horovodlikerun -np 2 python bench/latency.py [--bytes 4096] [--rounds 1000] [--barriers]
    horovodlikerun -np 2 python bench/latency.py --layers    # where an op's time goes

The clock is CLOCK_MONOTONIC (time.perf_counter), one clock for every process of a
node, so rank 0 can say how far apart the ranks left the barrier and how long each one's
op took from its own start: what `bench/worker.py`'s single-op rows time, split by rank.
Run it with HOROVOD_LOG_LEVEL=debug for the engine's barrier and two-shot counters.

It also times bench/worker.py's calibration workload before and after, and rank 0 ends
with one line `LATENCY {json}` (median and quartiles of every rank's op, calibration),
so that runs alternated against another build can be compared round by round, a run in
the machine's slow mode marked by bench/stats.py's rule.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import horovodlike as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker import calibrate_with  # noqa: E402


def pct(v):
    return " ".join(f"{q:.0f}" for q in np.percentile(v, [10, 50, 90]))


def layers(x, rounds):
    """The same in-flight allreduce timed through three layers, back to back, so that
    the differences say where an op's microseconds go (medians of 7 runs of `rounds`
    ops, the layers interleaved, each run after a barrier):
      api     hvd.allreduce(x, name=..., op=Sum): argument handling (the cached fast
              path after the first call: a blocking call with no handle), the output
              array, the engine;
      handles ops.submit_prepared + engine.wait + engine.release: our handle table and
              the engine module's wrappers, no argument handling, no output array;
      cffi    hvdl_enqueue, hvdl_wait and hvdl_release called straight from cffi with a
              request filled in once: the engine's own time (negotiation in the shared
              segment, the barrier with the other ranks, the reduction) and cffi's calls.
    """
    from horovodlike._engine import ffi, lib
    from horovodlike.common import engine, ops
    out = np.empty_like(x)
    prep = engine.Prepared(engine.ALLREDUCE, "allreduce.latency.layers",
                           engine.DTYPES["float32"], x.shape, engine.SUM)
    px, po = ffi.cast("void *", engine.address(x)), ffi.cast("void *", engine.address(out))
    h = ffi.new("int64_t *")
    msg, res = ffi.new("char[]", lib.HVDL_MSG_BYTES), ffi.new("hvdl_result *")
    req = prep.req

    def api():
        hvd.allreduce(x, name="latency.api", op=hvd.Sum)

    def handles():
        with ops.waiting:
            k = ops.submit_prepared(prep, (x, out), None, px, po)
        e = ops._pending.pop(k)[0]
        engine.wait(e, 60.0)
        engine.release(e)

    def cffi():
        req.input, req.output, req.flags = px, po, lib.HVDL_CALLER_WAITS
        lib.hvdl_enqueue(req, h)
        lib.hvdl_wait(h[0], 60.0)
        lib.hvdl_release(h[0], msg, res)

    fns = {"api": api, "handles": handles, "cffi": cffi}
    for fn in fns.values():
        for _ in range(200):
            fn()
    # Interleaved in blocks, so a change of the machine's load between the layers does
    # not pass for a difference between them.
    runs = {name: [] for name in fns}
    block = max(1, rounds // 7)
    for _ in range(7):
        for name, fn in fns.items():
            hvd.barrier()
            t = time.perf_counter()
            for _ in range(block):
                fn()
            runs[name].append((time.perf_counter() - t) / block * 1e6)
    return {name: float(np.median(v)) for name, v in runs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--barriers", action="store_true", help="time a stream of barriers only")
    ap.add_argument("--layers", action="store_true",
                    help="time the op through the API, our handles and cffi alone (layers())")
    args = ap.parse_args()
    hvd.init()
    x = np.ones(max(1, args.bytes // 4), np.float32)
    if args.layers:
        before = calibrate_with(hvd.barrier)
        result = layers(x, args.rounds)
        calibration = [before, calibrate_with(hvd.barrier)]
        if hvd.rank() == 0:
            per_layer = ", ".join(f"{k} {v:.1f}" for k, v in result.items())
            print(f"{args.bytes} B allreduce, {hvd.size()} ranks, us per op (median of 7 runs "
                  f"of {max(1, args.rounds // 7)}): {per_layer}")
            print("LAYERS " + json.dumps({"bytes": args.bytes, "ranks": hvd.size(), **result,
                                          "calibration": calibration}))
        return
    for _ in range(20):
        hvd.barrier()
        hvd.allreduce(x, op=hvd.Sum, name="latency")
    before = calibrate_with(hvd.barrier)
    rec = np.empty((args.rounds, 3))
    for i in range(args.rounds):
        a = time.perf_counter()
        hvd.barrier()
        b = time.perf_counter()
        if not args.barriers:
            hvd.allreduce(x, op=hvd.Sum, name="latency")
        rec[i] = a, b, time.perf_counter()
    calibration = [before, calibrate_with(hvd.barrier)]
    every = hvd.allgather(rec[None], name="latency.clocks")   # (ranks, rounds, 3)
    if hvd.rank() != 0:
        return
    us = 1e6
    if args.barriers:
        print(f"barrier, {hvd.size()} ranks, p10/50/90 us: {pct((every[:, :, 1] - every[:, :, 0]).ravel() * us)}")
        return
    left = every[:, :, 1]
    op = (every[:, :, 2] - left) * us
    late = left.argmax(0)
    idx = np.arange(args.rounds)
    print(f"{args.bytes} B allreduce after a barrier, {hvd.size()} ranks, p10/50/90 us:")
    print(f"  ranks leave the barrier apart by  {pct((left.max(0) - left.min(0)) * us)}")
    print(f"  the last rank's op                {pct(op[late, idx])}")
    print(f"  every rank's op                   {pct(op.ravel())}")
    print(f"  calibration before / after        {calibration[0] * 1e3:.1f} / "
          f"{calibration[1] * 1e3:.1f} ms")
    q25, q50, q75 = np.percentile(op.ravel(), [25, 50, 75])
    print("LATENCY " + json.dumps({"bytes": args.bytes, "ranks": hvd.size(), "median_us": q50,
                                   "p25_us": q25, "p75_us": q75, "calibration": calibration}))


if __name__ == "__main__":
    main()

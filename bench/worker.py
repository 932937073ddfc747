"""One benchmark job: ONE implementation, in its own processes, over all sizes.

    python bench/worker.py --impl ours|mpi|gloo|deepspeed|horovod --case sizes|resnet50|idle

Launched by bench/run.py under the implementation's own launcher. Rank 0 prints one JSON
line: {"impl": ..., "case": ..., "np": N, "results": {label: [seconds, ...]},
"calibration": {label: [seconds before, seconds after]}}: the fixed workload of
calibrate(), timed around each label's measurement, by which bench/stats.py tells a
round that ran in the machine's slow mode.
Only the implementation under test is imported, so no other library's threads run here.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import resnet50_gradient_shapes  # noqa: E402


class Ours:
    reduce_op = "SUM"     # --average: Average (Horovod's default op), ours only

    def __init__(self):
        import horovodlike as hvd
        from horovodlike.common import engine, ops
        self.hvd, self.engine, self.ops = hvd, engine, ops
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.prepared = {}

    def _prepared(self, x, name):
        # The request is prepared once per name and shape, as the API's cached fast path
        # does for a repeated call (horovodlike/common/request.py, allreduce_key).
        key = (name, x.shape)
        prepared = self.prepared.get(key)
        if prepared is None:
            prepared = self.prepared[key] = self.engine.Prepared(
                self.engine.ALLREDUCE, name, self.engine.DTYPES["float32"], x.shape,
                getattr(self.engine, self.reduce_op))
        return prepared

    def _submit(self, x, name):
        # In place, as MPI_IN_PLACE: the engine reads and writes the caller's buffer.
        at = self.engine.data_pointer(x)
        return self.ops.submit_prepared(self._prepared(x, name), (x,), lambda _: x, at, at)

    def allreduce(self, x):               # blocking, as a cached hvd.allreduce waits
        at = self.engine.data_pointer(x)
        self.ops.run_now(self._prepared(x, "bench"), (x,), at, at)

    def allreduce_flag(self, x):          # a name of its own: its shape differs
        at = self.engine.data_pointer(x)
        self.ops.run_now(self._prepared(x, "bench.flag"), (x,), at, at)

    def step(self, grads):
        handles = [self._submit(g, f"grad.{i}") for i, g in enumerate(grads)]
        for h in handles:
            self.ops.synchronize(h)

    def barrier(self):
        self.hvd.barrier()


class Mpi:
    def __init__(self):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allreduce(self, x):
        self.comm.Allreduce(self.MPI.IN_PLACE, x, op=self.MPI.SUM)

    def step(self, grads):        # what a framework without fusion does: one call per tensor
        for g in grads:
            self.allreduce(g)

    def barrier(self):
        self.comm.Barrier()


class Gloo:
    def __init__(self):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=int(os.environ["HOROVOD_RANK"]),
                                world_size=int(os.environ["HOROVOD_SIZE"]))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def allreduce(self, x):
        self.dist.all_reduce(self.torch.from_numpy(x))

    def step(self, grads):
        for g in grads:
            self.allreduce(g)

    def barrier(self):
        self.dist.barrier()


class DeepSpeed:
    """DeepSpeed's CPU shared-memory allreduce (deepspeed/ops/csrc/cpu/comm/shm.cpp), as
    its inference path calls it: deepspeed.comm over torch.distributed (gloo for the
    rendezvous), then torch.ops.deepspeed.inference_all_reduce_ on the tensor in place."""

    def __init__(self):
        import torch
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ["RANK"], os.environ["WORLD_SIZE"] = (os.environ["HOROVOD_RANK"],
                                                        os.environ["HOROVOD_SIZE"])
        os.environ["LOCAL_RANK"] = os.environ["HOROVOD_LOCAL_RANK"]
        os.environ["LOCAL_SIZE"] = os.environ["HOROVOD_LOCAL_SIZE"]   # shm.cpp reads it
        import deepspeed
        import deepspeed.comm as dist
        torch.set_num_threads(1)
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        if not (hasattr(torch.ops, "deepspeed")
                and hasattr(torch.ops.deepspeed, "inference_all_reduce_")):
            raise SystemExit("DeepSpeed's shm allreduce op did not load "
                             "(deepspeed.ops.op_builder.cpu.ShareMemCommBuilder)")
        self.torch, self.dist = torch, dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def allreduce(self, x):
        self.torch.ops.deepspeed.inference_all_reduce_(self.torch.from_numpy(x))

    def step(self, grads):
        for g in grads:
            self.allreduce(g)

    def barrier(self):
        self.dist.barrier()


class Horovod(Ours):
    def __init__(self):
        import horovod.torch as hvd  # noqa: F401  (only when installed)
        raise SystemExit("horovod benchmarking is not wired up")


IMPLS = {"ours": Ours, "mpi": Mpi, "gloo": Gloo, "deepspeed": DeepSpeed, "horovod": Horovod}


def agree(impl, want):
    """Whether any rank wants another sample; every rank gets the same answer, so every
    rank runs the same number of ops (each rank's own clock would not agree on when the
    budget ran out, and a rank that stopped early would leave its peers waiting)."""
    flag = np.array([1.0 if want else 0.0], np.float32)
    getattr(impl, "allreduce_flag", impl.allreduce)(flag)
    return flag[0] > 0


def timed(impl, fn, min_iters=5, max_iters=50, budget=1.0):
    if impl.size > (os.cpu_count() or 1):
        # Oversubscribed, a busy-polling peer can take seconds per call: fewer samples.
        min_iters = 3
    for _ in range(1 if impl.size > (os.cpu_count() or 1) else 3):
        fn()
    samples, start = [], time.perf_counter()
    while agree(impl, len(samples) < max_iters and
                (len(samples) < min_iters or time.perf_counter() - start < budget)):
        impl.barrier()
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples


CALIBRATION_BUFFERS = [np.ones(1 << 21, np.float32), np.empty(1 << 21, np.float32)]  # 8 MiB


def calibrate(impl):
    return calibrate_with(impl.barrier)


def calibrate_with(barrier):
    """Wall seconds of a fixed workload that needs no communication, run by every rank
    at once after a barrier (so the ranks compete for the cores as in a measurement):
    a Python loop and 8 MiB copies, about 5 ms on a quiet machine. It takes the same
    work whatever the implementation, so its time says how fast the machine was around
    a measurement (bench/stats.py explains the rule built on it)."""
    barrier()
    src, dst = CALIBRATION_BUFFERS
    t = time.perf_counter()
    for _ in range(3):
        acc = 0
        for i in range(20000):
            acc += i
        np.copyto(dst, src)
        np.copyto(src, dst)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--case", required=True, choices=["sizes", "resnet50", "idle"])
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864,268435456")
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--average", action="store_true",
                    help="ours only: reduce with Average instead of Sum")
    args = ap.parse_args()
    if args.average:
        if args.impl != "ours":
            ap.error("--average is for --impl ours (the peers' allreduce has no Average)")
        Ours.reduce_op = "AVERAGE"
    impl = IMPLS[args.impl]()
    results, calibration = {}, {}
    if args.case == "sizes":
        before = calibrate(impl)
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            x = np.ones(nbytes // 4, np.float32)
            results[str(nbytes)] = timed(impl, lambda: impl.allreduce(x), budget=args.budget)
            after = calibrate(impl)
            calibration[str(nbytes)], before = [before, after], after
    elif args.case == "resnet50":
        grads = [np.ones(s, np.float32) for s in resnet50_gradient_shapes()]
        before = calibrate(impl)
        results["resnet50"] = timed(impl, lambda: impl.step(grads), budget=args.budget * 3)
        calibration["resnet50"] = [before, calibrate(impl)]
    else:
        import resource
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.perf_counter()
        time.sleep(args.budget * 3)
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (t1.ru_utime + t1.ru_stime) - (t0.ru_utime + t0.ru_stime)
        results["idle_cpu_fraction"] = [cpu / (time.perf_counter() - w0)]
        impl.barrier()
    if impl.rank == 0:
        print("BENCH " + json.dumps({"impl": args.impl, "case": args.case, "np": impl.size,
                                     "results": results, "calibration": calibration}),
              flush=True)


if __name__ == "__main__":
    main()

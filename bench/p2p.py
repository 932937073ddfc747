"""Point-to-point latency and bandwidth at 2 ranks: horovodlike's hvd.send/hvd.recv
against mpi4py's Send/Recv and torch.distributed's gloo send/recv, alternated round by
round so that the machine's load falls on all three alike.

    mpirun -np 2 python bench/p2p.py [--sizes 4096,1048576,16777216] [--rounds 9]

Each round of one backend is a ping-pong of `iters` round trips of one message each
way; one-way time = round-trip / 2, bandwidth = bytes / one-way time. Reported: the
median over rounds (and the spread), per size and backend, and horovodlike's ratios to
MPI's. Under mpirun the three share the launch: horovodlike bootstraps from MPI's
environment, gloo rendezvouses at rank 0's address sent over MPI. Between two fake
nodes (network namespaces), bench/p2p_netns.py runs the same ping-pong.
"""
import argparse
import os
import socket
import time

import numpy as np


def pingpong(send, recv, me, iters):
    t = time.perf_counter()
    for _ in range(iters):
        if me == 0:
            send()
            recv()
        else:
            recv()
            send()
    return (time.perf_counter() - t) / iters / 2


def iterations(size):
    """Round trips per round for a message of `size` bytes (about 10 MB each way)."""
    return max(5, min(2000, int(2e8 // max(size, 4096) // 20)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--backends", default="horovodlike,mpi,gloo")
    ap.add_argument("--json", help="rank 0 writes the per-size medians and 10th/90th "
                    "percentiles (seconds, one way) here; bench/plot_p2p.py draws them")
    args = ap.parse_args()
    from mpi4py import MPI
    import horovodlike as hvd
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    assert comm.Get_size() == 2, "run with 2 ranks"
    hvd.init()
    peer = 1 - me
    backends = args.backends.split(",")
    dist = None
    if "gloo" in backends:
        import torch
        import torch.distributed as dist
        addr = comm.bcast(socket.gethostbyname("localhost") if me == 0 else None)
        port = comm.bcast(_free_port() if me == 0 else None)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=me, world_size=2)
        torch.set_num_threads(1)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        n = size // 8
        a = np.ones(n, np.float64)
        b = np.empty(n, np.float64)
        iters = iterations(size)
        fns = {}
        fns["horovodlike"] = (lambda: hvd.send(a, peer, name="pp"),
                              lambda: hvd.recv_(b, peer, name="pp"))
        fns["mpi"] = (lambda: comm.Send(a, dest=peer, tag=1), lambda: comm.Recv(b, source=peer, tag=1))
        if dist is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns["gloo"] = (lambda: dist.send(ta, peer), lambda: dist.recv(tb, peer))
        times = {k: [] for k in backends}
        for k in backends:                                # warm up every path
            pingpong(*fns[k], me, 3)
        for _ in range(args.rounds):
            for k in backends:
                comm.Barrier()
                times[k].append(pingpong(*fns[k], me, iters))
        if me == 0:
            med = {k: float(np.median(v)) for k, v in times.items()}
            spread = {k: (float(np.percentile(v, 10)), float(np.percentile(v, 90))) for k, v in times.items()}
            rows.append((size, med, spread))
    if me == 0:
        host = os.environ.get("HOROVOD_HOSTNAME", socket.gethostname())
        print(f"p2p ping-pong, 2 ranks ({host}), median of {args.rounds} alternated rounds")
        print(f"{'bytes':>10} " + " ".join(f"{k + ' us':>16} {k + ' GB/s':>16}" for k in backends)
              + "  hvdl/mpi time")
        for size, med, spread in rows:
            cols = " ".join(f"{med[k] * 1e6:16.1f} {size / med[k] / 1e9:16.3f}" for k in backends)
            ratio = (med["horovodlike"] / med["mpi"] if {"horovodlike", "mpi"} <= med.keys()
                     else float("nan"))
            print(f"{size:>10} {cols}  {ratio:.2f}x")
        if args.json:
            import json
            with open(args.json, "w") as f:
                json.dump({"rounds": args.rounds, "loadavg": os.getloadavg()[0],
                           "rows": [{"bytes": size, "median_s": med, "p10_p90_s": spread}
                                    for size, med, spread in rows]}, f)
    hvd.shutdown()
    if dist is not None:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()

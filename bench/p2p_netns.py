"""Point-to-point latency and bandwidth between two fake nodes: bench/p2p.py's ping-pong
with its two ranks in two network namespaces joined by a veth link (bench/netns.py),
horovodlike's hvd.send/hvd.recv_ against mpi4py's Send/Recv (OpenMPI over its TCP
transport, between the namespaces) and torch gloo's send/recv.

    sudo python bench/p2p_netns.py [--rates none,10gbit] [--rounds 5] [--sizes 4096,1048576,16777216]

rate "none" is the bare veth (nothing shaped: the hard case, where the link costs about
what loopback does and the software is all that differs); a rate such as 10gbit shapes
each node's egress with tc's token bucket. Every backend runs in its own 2-rank job per
round (horovodlikerun, mpirun, or two processes for gloo, each started inside its
namespace), the order reversed every round, so slow drift of a shared machine falls on
all three alike. Each job times every size once (bench/p2p.py's round: `iterations`
round trips after a warm-up); the table is the median over rounds of those one-way
times, with horovodlike's ratios to OpenMPI's and gloo's. `--base TREE` adds a fourth
backend, "base": horovodlike as built in another source tree (its package first on
PYTHONPATH), alternated with the rest, for a before/after of the same minutes.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from p2p import iterations, pingpong  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("horovodlike", "mpi", "gloo")


def worker(backend, sizes, rank, addr, port):
    """One rank of one job: time each size once, rank 0 prints the one-way times."""
    import numpy as np
    if backend == "horovodlike":
        import horovodlike as hvd
        hvd.init()
        me, barrier = hvd.rank(), hvd.barrier
    elif backend == "mpi":
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        me, barrier = comm.Get_rank(), comm.Barrier
    else:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
        me, barrier = rank, dist.barrier
    peer = 1 - me
    out = {}
    for size in sizes:
        a = np.ones(size // 8, np.float64)
        b = np.empty(size // 8, np.float64)
        if backend == "horovodlike":
            fns = (lambda: hvd.send(a, peer, name="pp"), lambda: hvd.recv_(b, peer, name="pp"))
        elif backend == "mpi":
            fns = (lambda: comm.Send(a, dest=peer, tag=1), lambda: comm.Recv(b, source=peer, tag=1))
        else:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns = (lambda: dist.send(ta, peer), lambda: dist.recv(tb, peer))
        pingpong(*fns, me, 3)                              # warm up
        barrier()
        out[size] = pingpong(*fns, me, iterations(size))
        assert b[0] == 1.0 and b[-1] == 1.0, "the message did not arrive"
    if me == 0:
        print("P2P " + json.dumps(out), flush=True)
    if backend == "horovodlike":
        hvd.shutdown()
    elif backend == "gloo":
        dist.destroy_process_group()


MPI_AGENT = """#!/bin/sh
# PRRTE's remote launcher, called as: <agent> <host> <command string>; the hosts are the
# fake nodes' addresses, and the command runs inside that node's namespace.
host=$1; shift
case "$host" in
{cases}
  *) echo "p2p_netns: unknown fake node $host" >&2; exit 1;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


def job(backend, net, sizes, timeout, tmp, base=None):
    """One 2-rank job of `backend` across the two fake nodes: {size: one-way seconds}.
    "base" is horovodlike imported from the tree `base`."""
    tree = base if backend == "base" else ROOT
    backend = "horovodlike" if backend == "base" else backend
    me = [sys.executable, os.path.abspath(__file__), "--worker", backend,
          "--sizes", ",".join(map(str, sizes))]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    # whatever restricts OpenMPI to loopback elsewhere would keep it off the link here
    for k in [k for k in env if k.startswith(("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_"))]:
        del env[k]
    subnet = f"{net.subnet}.0/24"
    if backend == "horovodlike":
        env.update(net.env())
        cmds = [[shutil.which("horovodlikerun") or "horovodlikerun", "-np", "2",
                 *net.launcher_args(per_node=1), *me]]
    elif backend == "mpi":
        agent = os.path.join(tmp, "agent.sh")
        cases = "\n".join(f"  {net.address(i)}) ns={ns};;" for i, ns in enumerate(net.nodes, 1))
        with open(agent, "w") as f:
            f.write(MPI_AGENT.format(cases=cases))
        os.chmod(agent, 0o755)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   PRTE_MCA_plm_ssh_agent=agent, PRTE_MCA_oob_tcp_if_include=subnet,
                   OMPI_MCA_btl="tcp,self", OMPI_MCA_btl_tcp_if_include=subnet,
                   OMPI_MCA_pml="ob1",
                   # both fake nodes have this machine's host name, so OpenMPI's
                   # node-aware collectives take them for one node and its barrier
                   # hangs; the ping-pong itself is Send/Recv over the TCP transport
                   OMPI_MCA_coll="^han,sm,xhc,acoll")
        # each fake node looks like the whole machine to OpenMPI, which would bind both
        # ranks to its first core: they would then take turns on one core
        cmds = [["mpirun", "-np", "2", "--bind-to", "none",
                 "--host", f"{net.address(1)}:1,{net.address(2)}:1",
                 "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", *me]]
    else:
        port = 29500 + os.getpid() % 1000
        env.update(net.torch_env())
        cmds = [["ip", "netns", "exec", ns, *me, "--rank", str(r), "--addr", net.address(1),
                 "--port", str(port)] for r, ns in enumerate(net.nodes)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for c in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for out, _ in outs:
        for line in out.splitlines():
            if "P2P " in line:                    # horovodlikerun prefixes the rank
                return {int(k): v for k, v in json.loads(line.split("P2P ", 1)[1]).items()}
    raise RuntimeError(f"{backend} failed ({[p.returncode for p in procs]}):\n"
                       + "\n".join(f"{o[-2000:]}\n{e[-3000:]}" for o, e in outs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="none", help="comma-separated: none (the bare veth) "
                    "or tc rates such as 10gbit")
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the per-round one-way times here")
    ap.add_argument("--base", help="another source tree whose horovodlike runs as backend "
                    "'base', alternated with the others")
    ap.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        return worker(args.worker, sizes, args.rank, args.addr, args.port)
    why = netns.available()
    if why:
        sys.exit(f"p2p_netns: {why}")
    backends = args.backends.split(",") + (["base"] if args.base else [])
    samples = {}                                   # rate -> backend -> size -> [seconds]
    load = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates.split(","):
            with netns.TwoNodes(rate=None if rate == "none" else rate) as net:
                for rnd in range(args.rounds):
                    for b in (backends if rnd % 2 == 0 else backends[::-1]):
                        t = time.time()
                        res = job(b, net, sizes, args.timeout, tmp, args.base)
                        load.append(os.getloadavg()[0])
                        for size, sec in res.items():
                            samples.setdefault(rate, {}).setdefault(b, {}).setdefault(size, []).append(sec)
                        print(f"  {rate} round {rnd + 1}/{args.rounds} {b}: "
                              + ", ".join(f"{s}: {v * 1e6:.1f} us" for s, v in res.items())
                              + f" ({time.time() - t:.0f} s, load {load[-1]:.1f})",
                              file=sys.stderr, flush=True)
    print(f"p2p ping-pong between two fake nodes, one-way us (GB/s), median of {args.rounds} "
          f"rounds; load average {min(load):.1f}-{max(load):.1f}")
    others = [b for b in ("mpi", "gloo", "base") if b in backends]
    print("| link | bytes | " + " | ".join(backends) + " | "
          + " | ".join(f"horovodlike / {o} time" for o in others if "horovodlike" in backends) + " |")
    print("|---" * (2 + len(backends) + (len(others) if "horovodlike" in backends else 0)) + "|")
    for rate, by in samples.items():
        for size in sizes:
            med = {b: statistics.median(by[b][size]) for b in backends}
            cells = [f"{med[b] * 1e6:.1f} ({size / med[b] / 1e9:.3f})" for b in backends]
            if "horovodlike" in backends:
                for o in others:
                    per = sorted(h / m for h, m in zip(by["horovodlike"][size], by[o][size]))
                    cells.append(f"{med['horovodlike'] / med[o]:.2f}x "
                                 f"[{per[0]:.2f}-{per[-1]:.2f}]")
            print(f"| {'veth' if rate == 'none' else rate} | {size} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "loadavg": load, "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()

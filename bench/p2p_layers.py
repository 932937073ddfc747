"""Where a small point-to-point message's microseconds go: a 4 KiB ping-pong at 2 ranks
timed through two layers, interleaved (medians of 7 runs of `--rounds` round trips,
each run after a barrier; one-way time = round trip / 2):

    horovodlikerun -np 2 python bench/p2p_layers.py [--rounds 3000] [--bytes 4096]

  api   hvd.send / hvd.recv_ with a name: argument handling (the cached fast path after
        the first call), the blocking wait, the release;
  cffi  a send and a recv_ request filled in once (engine.Prepared: its enqueue sets
        the two buffers and the flags), then hvdl_wait and hvdl_release straight from
        cffi: the engine's own time (the mailbox, matching, the polling wait) and
        cffi's calls;
  run   the same requests through hvdl_run straight from cffi: the engine's time and
        one cffi call a message on each side (the floor of the API's one-call path;
        left out by a build without hvdl_run);
  torch horovodlike.torch's send / recv_ of a CPU tensor with a name.

The difference is what the Python binding costs per message (compare bench/latency.py
--layers for allreduce).
"""
import argparse

import numpy as np

import torch

import horovodlike as hvd
import horovodlike.torch as th
from horovodlike._engine import ffi, lib
from horovodlike.common import engine, request
from p2p import pingpong          # bench/p2p.py's: one-way seconds of a ping-pong


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--bytes", type=int, default=4096)
    args = ap.parse_args()
    hvd.init()
    assert hvd.size() == 2, "run with 2 ranks"
    me, peer = hvd.rank(), 1 - hvd.rank()
    x = np.ones(args.bytes // 8, np.float64)
    y = np.empty_like(x)
    code = engine.DTYPES["float64"]
    sp = request.prepare(request.p2p("send", peer, "layers.cffi", None, what="send"),
                         code, x.shape)
    rp = request.prepare(request.p2p("recv", peer, "layers.cffi", None, what="recv_"),
                         code, y.shape, recv_into=True)
    px, py = ffi.cast("void *", engine.address(x)), ffi.cast("void *", engine.address(y))
    msg, res = ffi.new("char[]", lib.HVDL_MSG_BYTES), ffi.new("hvdl_result *")

    def run(prepared, inp, out):
        handle = prepared.enqueue(inp, out, True)    # sets the two buffers and the flags
        rc = lib.hvdl_wait(handle, 60.0)
        rc = lib.hvdl_release(handle, msg, res) if rc == lib.HVDL_OK else rc
        if rc != lib.HVDL_OK:
            raise RuntimeError(f"status {rc}: {ffi.string(msg).decode()}")

    handle = ffi.new("int64_t *")

    def one_call(prepared, inp, out):
        rc = lib.hvdl_run(prepared.req, inp, out, 60.0, handle, msg, ffi.NULL)
        if rc != lib.HVDL_OK:
            raise RuntimeError(f"status {rc}: {ffi.string(msg).decode()}")

    tx, ty = torch.from_numpy(x), torch.empty(len(x), dtype=torch.float64)
    layers = {
        "cffi": (lambda: run(sp, px, ffi.NULL), lambda: run(rp, ffi.NULL, py)),
        "run": (lambda: one_call(sp, px, ffi.NULL), lambda: one_call(rp, ffi.NULL, py)),
        "api": (lambda: hvd.send(x, peer, name="layers.api"),
                lambda: hvd.recv_(y, peer, name="layers.api")),
        "torch": (lambda: th.send(tx, peer, name="layers.torch"),
                  lambda: th.recv_(ty, peer, name="layers.torch")),
    }
    if not hasattr(lib, "hvdl_run"):
        del layers["run"]

    for pair in layers.values():
        pingpong(*pair, me, 500)
    runs = {name: [] for name in layers}
    for _ in range(7):
        for name, pair in layers.items():
            hvd.barrier()
            runs[name].append(pingpong(*pair, me, args.rounds) * 1e6)
    assert (y == x).all() and (ty.numpy() == x).all(), "the message did not arrive"
    if me == 0:
        for name, v in runs.items():
            print(f"{name:5s} one-way {np.median(v):6.2f} us  (runs: "
                  f"{', '.join(f'{t:.1f}' for t in v)})")
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""Failures on backend="horovodlike". argv[1]:
  mismatch  ranks all_reduce different shapes: an error naming both, never a hang
  lost      rank 1 dies; rank 0's waiting all_reduce fails naming rank 1
  timeout   Work.wait(timeout) raises while a peer is late; the op still completes
  destroy   the last rank destroys its group first; the others' sub-group goes on
"""
from _torch_common import *  # noqa: F401,F403
import datetime
import os
import sys
import torch.distributed as dist
import horovodlike.torch.distributed  # noqa: F401

mode = sys.argv[1]
dist.init_process_group("horovodlike")
R, N = dist.get_rank(), dist.get_world_size()
dist.barrier()

if mode == "mismatch":
    t = torch.ones(3 if R == 0 else 4)
    try:
        dist.all_reduce(t)
        fail("mismatched all_reduce", "did not raise")
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        check("float32[3]" in msg and "float32[4]" in msg, "the error names both shapes", msg)
    finish_alone()
    os._exit(0)            # the job has failed: no shutdown handshake to wait for

if mode == "lost":
    if R == 1:
        os._exit(3)
    try:
        dist.all_reduce(torch.ones(4))
        fail("all_reduce with a lost peer", "did not raise")
    except Exception as e:  # noqa: BLE001
        check("rank 1" in str(e), "the error names the lost rank", str(e))
    finish_alone()
    os._exit(0)

if mode == "timeout":
    t = torch.ones(4)
    if R == 0:
        w = dist.all_reduce(t, async_op=True)
        try:
            w.wait(timeout=datetime.timedelta(seconds=1))
            fail("wait(timeout) with a late peer", "did not raise")
        except dist.DistBackendError as e:
            check("within 1 s" in str(e), "the timeout error says so", str(e))
        arrive("late")
        w.wait()
        t_equal(t, torch.full((4,), float(N)), "the op completes after the timeout")
    else:
        wait_for("late")
        dist.all_reduce(t)
    finish()

if mode == "destroy":
    sub = dist.new_group(list(range(N - 1)))
    if R == N - 1:
        dist.destroy_process_group()   # returns once the others have ended too
        finish_alone()
        sys.exit(0)
    for i in range(20):
        t = torch.full((3,), float(i))
        dist.all_reduce(t, group=sub)
        t_equal(t, torch.full((3,), float(i * (N - 1))), f"sub-group op {i} after a peer left")
    finish_alone()
    dist.destroy_process_group()

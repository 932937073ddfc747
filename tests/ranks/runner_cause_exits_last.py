"""Rank program of tests/test_runner.py, run by
test_launcher_names_the_rank_that_failed_first_not_the_first_to_exit (3 ranks).

Rank 2 raises ValueError while the others wait in an allreduce that needs it. Its engine
shuts down at exit, which fails the others' allreduce naming rank 2; rank 2 then waits
until both have exited (a handshake on their pid files, not a sleep), so a victim is
always the first rank to exit."""
import atexit
import os
import time

D = os.environ["HVDTEST_DIR"]


def exit_after_the_victims():
    # Registered before horovodlike is imported, so it runs after the engine's shutdown.
    deadline = time.monotonic() + 60
    pids = [int(f[:-4]) for f in os.listdir(D) if f.endswith(".pid")]
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)      # polling the others' exit: there is nothing to wait on


if int(os.environ["HOROVOD_RANK"]) == 2:
    atexit.register(exit_after_the_victims)

import numpy as np  # noqa: E402
import horovodlike as hvd  # noqa: E402

hvd.init()
if hvd.rank() == 2:
    while len([f for f in os.listdir(D) if f.endswith(".pid")]) < 2:
        time.sleep(0.05)      # polling for the others' files: the handshake
    raise ValueError("rank two's optimizer step failed")
open(os.path.join(D, f"{os.getpid()}.pid"), "w").close()
hvd.allreduce(np.ones(4, dtype=np.float32), name="grads")

"""Rank program of tests/test_faults.py, run by test_fault_matrix,
test_mpirun_stopped_rank_ends_the_job, test_mpirun_resumed_rank_names_itself."""
import os
import signal
import sys
import threading
import time
import numpy as np
import horovodlike as hvd


def main():
    phase, victim = os.environ["FAULT_PHASE"], int(os.environ["FAULT_VICTIM"])
    sig = getattr(signal, os.environ["FAULT_SIGNAL"])
    me = int(os.environ.get("HOROVOD_RANK") or os.environ["OMPI_COMM_WORLD_RANK"])

    def hit():
        print("VICTIM-HIT", flush=True)
        os.kill(os.getpid(), sig)

    def wait_until_victim_stopped(pidfile, timeout=30):
        # until the victim (its pid in pidfile) is stopped, a zombie or gone
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(pidfile) as f:
                    pid = int(f.read())
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in "tTZX":
                        return
            except (FileNotFoundError, ProcessLookupError, ValueError):
                if os.path.exists(pidfile):
                    return                   # the pid is written, its /proc entry gone
            time.sleep(0.005)
        raise TimeoutError(f"the victim did not stop within {timeout} s")

    if os.environ.get("FAULT_IGNORE_TERM"):
        # as a script that checkpoints on SIGTERM does: mpirun, which resumes a stopped
        # rank to end it, then waits a moment before SIGKILL, and the rank has its say
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if phase == "init" and me == victim:
        hit()
    hvd.init()
    try:
        if phase == "negotiation":
            hvd.allreduce(np.ones(4), name="warm")
            if me == victim:
                hit()
            hvd.allreduce(np.ones(4), name="never-agreed")
        elif phase in ("shm", "ring"):
            x = np.ones(1 << 22, np.float32)
            hvd.allreduce(x, name="warm")
            if me == victim:
                threading.Timer(0.3, hit).start()
            for i in range(100000):
                hvd.allreduce(x, name="big")
        elif phase == "shutdown":
            hvd.allreduce(np.ones(4), name="warm")
            pidfile = os.path.join(os.environ["HVDTEST_DIR"], "victim.pid")
            if me == victim:
                with open(pidfile + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(pidfile + ".tmp", pidfile)
                hit()
            else:
                # The victim stops before the others shut down; one that stops after the
                # job has shut down is only a process that has not exited yet.
                wait_until_victim_stopped(pidfile)
            hvd.shutdown()
        print("FINISHED", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"FAILED: {e}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()

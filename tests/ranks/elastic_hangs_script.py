"""Rank program of tests/test_elastic_hangs.py, run by
test_no_new_worker_starts_once_a_member_has_finished,
test_stopped_member_is_dropped_and_a_spare_host_takes_its_place."""
import os
import signal
import sys
import time
import numpy as np
import horovodlike as hvd
from horovodlike.common import elastic, objects


def main():
    host, wid = os.environ["HOROVOD_HOSTNAME"], os.environ["HOROVODLIKE_ELASTIC_WORKER"]
    print(f"hello worker={wid} host={host}", flush=True)
    STEPS = int(os.environ.get("EL_STEPS", "40"))
    FAULT = os.environ.get("EL_FAULT", "")          # kind:host:step, kind stop or exit0
    hvd.init()

    def train(state):
        print(f"start worker={wid} host={host} size={hvd.size()} step={state.step}",
              flush=True)
        while state.step < STEPS:
            if FAULT:
                kind, fhost, fstep = FAULT.split(":")
                if (host, state.step) == (fhost, int(fstep)):
                    print(f"fault {kind} worker={wid}", flush=True)
                    if kind == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    sys.exit(0)
            total = hvd.allreduce(np.ones(4), op=hvd.Sum, name="grad")
            assert total[0] == hvd.size(), total
            state.step += 1
            state.commit()
            time.sleep(0.05)

    state = elastic.ObjectState(objects.broadcast_object, hvd.rank, step=0)
    elastic.run_fn(train, elastic.reset)(state)
    print(f"final worker={wid} host={host} size={hvd.size()} step={state.step}", flush=True)


if __name__ == "__main__":
    main()

"""Rank program of tests/test_elastic_torch.py, run by test_process_sets_after_a_reset."""
import os
import signal
import time
import torch
import horovodlike.torch as hvd


def main():
    hvd.init(process_sets="dynamic")
    host = os.environ["HOROVOD_HOSTNAME"]
    sets = {"pair": hvd.add_process_set([0, 1])}
    first = sets["pair"]

    def on_reset():                 # the ranks changed: make the set again
        sets["pair"] = hvd.add_process_set([0, 1])

    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < 20:
            if host == "b" and state.step == 8:
                os.kill(os.getpid(), signal.SIGKILL)
            total = hvd.allreduce(torch.ones(2), name="all", op=hvd.Sum)
            if hvd.rank() in (0, 1):
                pair = hvd.allreduce(torch.ones(2), name="pair", op=hvd.Sum,
                                     process_set=sets["pair"])
                assert pair.tolist() == [2.0, 2.0], pair
            state.step += 1
            state.commit()
            time.sleep(0.02)
        return total

    total = train(state)
    try:
        hvd.allreduce(torch.ones(1), name="stale", process_set=first)
        refused = "no"
    except ValueError as e:
        refused = "yes" if "not registered" in str(e) else repr(e)
    print(f"final rank={hvd.rank()} size={hvd.size()} total={int(total[0])} "
          f"stale_refused={refused} pair={','.join(map(str, sets['pair'].ranks))}", flush=True)


if __name__ == "__main__":
    main()

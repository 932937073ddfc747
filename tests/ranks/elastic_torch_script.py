"""Rank program of tests/test_elastic_torch.py, run by
test_cooldown_brings_a_host_back_and_reset_limit_stops_the_job,
test_discovered_hosts_join_with_the_committed_state,
test_failing_host_is_blacklisted_for_good,
test_not_enough_slots_to_start_fails_after_the_timeout,
test_rank_exiting_zero_early_does_not_end_the_job,
test_removed_host_is_drained_even_below_min_np,
test_sigkilled_rank_job_goes_on_from_last_commit,
test_too_few_slots_for_longer_than_the_timeout_fails."""
import hashlib
import os
import signal
import sys
import time
import numpy as np
import torch
import horovodlike.torch as hvd
from sklearn.datasets import load_digits


def main():
    torch.set_num_threads(1)
    hvd.init()
    host, wid = os.environ["HOROVOD_HOSTNAME"], os.environ["HOROVODLIKE_ELASTIC_WORKER"]
    print(f"hello worker={wid} host={host} rank={hvd.rank()} size={hvd.size()}", flush=True)

    EPOCHS = int(os.environ.get("EL_EPOCHS", "4"))
    COMMIT = int(os.environ.get("EL_COMMIT", "4"))
    FAULT = os.environ.get("EL_FAULT", "")            # kind:host:epoch:batch
    HOSTS_AT = os.environ.get("EL_HOSTS_AT", "")      # epoch:batch:new host file (\n as ;)
    SLOW = float(os.environ.get("EL_SLOW", "0"))      # seconds per batch ...
    SLOW_BELOW = int(os.environ.get("EL_SLOW_BELOW", "1000"))   # ... while size < this

    digits = load_digits()
    x = torch.tensor((digits.data / 16.0).astype(np.float32))
    y = torch.tensor(digits.target, dtype=torch.int64)
    train_set = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    x_test, y_test = x[1400:], y[1400:]

    # Every worker starts from different weights: only the sync makes them agree.
    torch.manual_seed(1000 + int(wid))
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    base_lr = 0.02
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(train_set, batch_size=16, sampler=sampler)

    def digest():
        parts = [t.detach().numpy().tobytes() for t in model.state_dict().values()]
        st = optimizer.state_dict()["state"]
        for k in sorted(st):
            parts += [v.numpy().tobytes() for _, v in sorted(st[k].items()) if torch.is_tensor(v)]
        return hashlib.sha256(b"".join(parts)).hexdigest()[:16]

    def fault(epoch, batch):
        if not FAULT:
            return
        kind, fhost, fepoch, fbatch = FAULT.split(":")
        at = (int(fepoch), int(fbatch))
        # "fail" keeps failing on its host (a new worker there fails at once)
        if host != fhost or ((epoch, batch) < at if kind == "fail" else (epoch, batch) != at):
            return
        print(f"fault {kind} worker={wid}", flush=True)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(0 if kind == "exit0" else 3)

    def hosts_change(epoch, batch):
        if HOSTS_AT and hvd.rank() == 0:
            e, b, text = HOSTS_AT.split(":", 2)
            path = os.environ["EL_HOSTFILE"]
            want = text.replace(";", "\n")
            if (epoch, batch) == (int(e), int(b)) and open(path).read() != want:
                open(path, "w").write(want)
                open(path + ".marker", "w").write("x")
                print(f"hosts-changed worker={wid}", flush=True)

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = base_lr * hvd.size()

    @hvd.elastic.run
    def train(state):
        print(f"start worker={wid} size={hvd.size()} rank={hvd.rank()} epoch={state.epoch} "
              f"batch={state.batch} hash={digest()}", flush=True)
        for state.epoch in range(state.epoch, EPOCHS):
            for i, (xb, yb) in enumerate(loader):
                batch = state.batch
                fault(state.epoch, batch)
                hosts_change(state.epoch, batch)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                state.batch = batch + 1
                sampler.record_batch(i, 16)
                if state.batch % COMMIT == 0:
                    state.commit()
                else:
                    state.check_host_updates()
                if SLOW and hvd.size() < SLOW_BELOW:
                    time.sleep(SLOW)
            print(f"epoch-done worker={wid} epoch={state.epoch} size={hvd.size()}", flush=True)
            state.batch = 0
            sampler.set_epoch(state.epoch + 1)
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    with torch.no_grad():
        acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(f"final worker={wid} rank={hvd.rank()} size={hvd.size()} epoch={state.epoch} "
          f"hash={digest()} acc={acc:.4f}", flush=True)


if __name__ == "__main__":
    main()

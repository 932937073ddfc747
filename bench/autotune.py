"""The autotuner against hand-tuned knobs, on the synthetic benchmark's MLP.

    python bench/autotune.py [--np 2,4] [--rounds 3] [--steps 420] [--tail 100]

Three settings, each a job of its own (horovodlikerun, one intra-op thread per rank),
alternated round by round (the order reverses every round):
  default   the engine's and DistributedOptimizer's defaults (the hand-tuned knobs);
  bad       a deliberately bad start: HOROVOD_FUSION_THRESHOLD=1 MiB (so 1 MiB buckets
            too) and HOROVOD_CYCLE_TIME=20 ms;
  tuned     the bad start with HOROVOD_AUTOTUNE=1 and Horovod's autotune defaults (3
            warm-up samples, 10 steps per sample, 20 Bayesian samples).
Each job trains --steps steps of the synthetic benchmark's MLP (examples/
pytorch_synthetic_benchmark.py, 7 MiB of gradients, batch 32) and reports the steps per
second of its last --tail steps; for `tuned` these come after the search has ended
(the job fails otherwise). The row is the median over rounds, with the spread, and the
ratios tuned/default (target >= 0.95) and tuned/bad (target >= 1).

    python bench/autotune.py --worker    # one job's rank program (used by the above)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
SETTINGS = {
    "default": {},
    "bad": {"HOROVOD_FUSION_THRESHOLD": str(MiB), "HOROVOD_CYCLE_TIME": "20"},
    "tuned": {"HOROVOD_FUSION_THRESHOLD": str(MiB), "HOROVOD_CYCLE_TIME": "20",
              "HOROVOD_AUTOTUNE": "1"},
}


def worker(steps, tail):
    import importlib.util

    import torch
    import torch.nn.functional as F

    import horovodlike.torch as hvd
    spec = importlib.util.spec_from_file_location(
        "pytorch_synthetic_benchmark",
        os.path.join(os.path.dirname(HERE), "examples", "pytorch_synthetic_benchmark.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hvd.init()
    model = example.MODELS["mlp"](argparse.Namespace(num_classes=10, image_size=32))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data, target = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    stamps, tuned_at = [], None
    for i in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
        stamps.append(time.perf_counter())
        if tuned_at is None and opt._tuner is not None and opt._tuner.done:
            tuned_at = i
    if opt._tuner is not None and (tuned_at is None or tuned_at >= steps - tail):
        raise SystemExit(f"the search ended at step {tuned_at}, not before the last {tail} "
                         f"steps: raise --steps")
    if hvd.rank() == 0:
        rate = tail / (stamps[-1] - stamps[-1 - tail])
        kept = opt._tuner.kept if opt._tuner is not None else None
        print("BENCH " + json.dumps({"steps_per_s": rate, "tuned_at": tuned_at,
                                     "kept": kept}), flush=True)
    hvd.shutdown()


def run_job(np_, setting, steps, tail):
    env = dict(os.environ, **SETTINGS[setting])
    for k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE"):
        if k not in SETTINGS[setting]:
            env.pop(k, None)
    cmd = ["horovodlikerun", "-np", str(np_), sys.executable, os.path.abspath(__file__),
           "--worker", "--steps", str(steps), "--tail", str(tail)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise SystemExit(f"{setting} np={np_} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=420)
    ap.add_argument("--tail", type=int, default=100)
    args = ap.parse_args()
    if args.worker:
        return worker(args.steps, args.tail)
    order = list(SETTINGS)
    for np_ in [int(n) for n in args.np.split(",")]:
        got = {s: [] for s in order}
        for r in range(args.rounds):
            for s in (order if r % 2 == 0 else order[::-1]):
                res = run_job(np_, s, args.steps, args.tail)
                got[s].append(res["steps_per_s"])
                print(f"np={np_} round {r} {s}: {res['steps_per_s']:.1f} steps/s"
                      + (f" (search ended at step {res['tuned_at']}, kept {res['kept']})"
                         if s == "tuned" else ""), flush=True)
        med = {s: statistics.median(v) for s, v in got.items()}
        print(f"np={np_}: " + "; ".join(
            f"{s} {med[s]:.1f} [{min(got[s]):.1f}-{max(got[s]):.1f}]" for s in order)
            + f" steps/s; tuned/default {med['tuned'] / med['default']:.2f}, "
              f"tuned/bad {med['tuned'] / med['bad']:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Pipeline parallelism (horovodlike.torch.pipeline) on real ranks.

The reference everywhere is the whole model in one process, trained with gradient
accumulation over the same micro-batches (each micro-batch's loss / m), in float64.

Launch 1 (4 ranks, plain hvd.init): Topology(pp=2) (two independent pipelines side by
side) and Topology(pp=4); an MLP and a tiny transformer; m in {1, 4, 8}; GPipe and
1F1B: the losses (StepOutput, on every rank) and every parameter after 3 SGD steps equal
the reference within 1e-10; eval_batch; per-micro-batch sequence lengths that change the
activation shape between stages; tied embedding / LM head (gradients equal the
reference's, copies bitwise equal); each rank's parameters are exactly its stage's
layers; saved activations counted with saved_tensors_hooks peak at <= p-k micro-batches
on stage k under 1F1B and at m under GPipe; checkpoint_layers; the argument errors.
Launch 2 (4 ranks): pp 2 × dp 2 with DistributedOptimizer and with
ShardedDistributedOptimizer(stage=2) over topo.dp_set against the global batch, with and
without a tied embedding / LM head.
Then: 50 back-to-back 1F1B batches of varying size at 2 ranks; the bubble of stages that
sleep (forward t, backward 2t), read from the timeline by the viewer's analysis, within
±2 points of (p-1)/(m+p-1) at p=2 and p=4 (m=8), and the viewer naming a slow stage;
SIGKILL of the last stage during its drain and SIGSTOP of a middle stage: every other
rank fails naming it, within the peer timeout; the example at pp 2 × dp 2.
"""
import importlib.util

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)


EQUIV_BODY = rank_program("torch_pipeline_equiv_body")

DP_BODY = rank_program("torch_pipeline_dp_body")


def test_pipeline_equivalence_tied_memory_and_errors():
    run_torch(EQUIV_BODY, 4, timeout=280)


def test_pipeline_with_data_parallel_optimizers():
    run_torch(DP_BODY, 4, timeout=150)


# ---------------------------------------------------------------- bubble (timeline)

SLEEP_STAGES = rank_program("torch_pipeline_sleep_stages")


@pytest.mark.parametrize("p,schedule", [(2, "1f1b"), (4, "1f1b")])
def test_pipeline_bubble_from_the_timeline_matches_the_cost_model(tmp_path, p, schedule):
    from horovodlike.timeline_viewer.analyses import pipeline
    from horovodlike.timeline_viewer.model import open_timeline
    path = tmp_path / "tl.json"
    run_torch(SLEEP_STAGES, p, timeout=120,
              env={"HOROVOD_TIMELINE": str(path), "STAGE_SECONDS": "0.1",
                   "SCHEDULE": schedule, "BATCHES": "3"})
    rep = pipeline(open_timeline([str(tmp_path)]))
    m = 8
    ideal = (p - 1) / (m + p - 1)
    assert rep is not None and rep.stages == p and rep.microbatches == m, rep
    assert rep.batches == 2, rep           # the first (warm-up) batch is left out
    got = {r: round(x.bubble, 4) for r, x in rep.ranks.items()}
    assert sorted(x.stage for x in rep.ranks.values()) == list(range(p)), rep
    assert all(abs(b - ideal) <= 0.02 for b in got.values()), (got, ideal)


def test_timeline_viewer_names_the_stage_that_holds_the_pipeline_up(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "tl.json"
    run_torch(SLEEP_STAGES, 4, timeout=120,
              env={"HOROVOD_TIMELINE": str(path), "STAGE_SECONDS": "0.03",
                   "SCHEDULE": "1f1b", "BATCHES": "2", "SLOW_STAGE": "2"})
    out = subprocess.run([sys.executable, "-m", "horovodlike.timeline_viewer", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Pipeline (4 stages, 8 micro-batches, 1 batches): stage 2 (rank 2) holds the " \
           "others up" in out.stdout, out.stdout[:3000]
    assert "Pipeline bubble" in out.stdout, out.stdout[:3000]


# ---------------------------------------------------------------- back to back

BACK_TO_BACK = rank_program("torch_pipeline_back_to_back")


def test_pipeline_fifty_back_to_back_1f1b_batches():
    run_torch(BACK_TO_BACK, 2, timeout=120)


# ---------------------------------------------------------------- faults

FAULT = rank_program("torch_pipeline_fault")


@pytest.mark.parametrize("victim,sig", [(3, "SIGKILL"), (1, "SIGSTOP")])
def test_pipeline_fault_fails_every_rank_naming_the_lost_stage(victim, sig):
    peer_timeout = 4
    res = run_ranks(FAULT, 4, timeout=90,
                    env={"VICTIM": str(victim), "SIG": sig,
                         "HOROVODLIKE_PEER_TIMEOUT_SECONDS": str(peer_timeout)})
    lines = res.rank_lines()
    at = [float(ln.split()[1]) for ln in lines.get(victim, []) if ln.startswith("VICTIM")]
    assert at, res.describe()
    errors = res.rank_lines("stderr")
    for r in range(4):
        if r == victim:
            continue
        failed = [ln for ln in lines.get(r, []) if ln.startswith("FAILED")]
        if not failed:
            # the launcher stops the others once each has logged its engine's verdict
            # on the killed rank (launch.py, _await_verdicts): a rank stopped before
            # it printed FAILED has still logged it
            logged = [ln for ln in errors.get(r, []) if "ERROR: rank" in ln]
            assert logged and f"rank {victim} (host" in logged[0], \
                f"rank {r} did not fail naming rank {victim}\n{res.describe()}"
            continue
        took = float(failed[0].split()[1]) - at[0]
        assert f"rank {victim} (host" in failed[0], failed[0]
        # a killed rank's sockets close at once; a stopped one is found by the heartbeats
        # within the peer timeout (plus a heartbeat interval and the load here)
        assert took < 2 * peer_timeout + 3, (r, took, failed[0])
    assert res.elapsed < 60, res.describe()


def test_example_trains_pp2_dp2():
    from harness import REPO
    res = run_ranks(REPO / "examples" / "pytorch_pipeline_transformer.py", 4,
                    args=["--steps", "12", "--sharded"], timeout=150)
    assert res.returncode == 0, res.describe()
    lines = res.rank_lines()[0]
    out = "\n".join(lines)
    losses = [float(ln.split()[-1]) for ln in lines if ln.startswith("step")]
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0], out
    rows = [ln for ln in lines if ln.startswith("rank ") and "parameter bytes" in ln]
    assert [ln.split()[3] for ln in rows] == ["0", "0", "1", "1"], out    # stage per rank
    assert "cost model bubble (p-1)/(m+p-1) = 11.1%" in out, out


FOUND_OPTIMIZER = rank_program("torch_pipeline_found_optimizer")


def test_pipeline_finds_the_distributed_optimizer_without_optimizer_argument():
    run_torch(FOUND_OPTIMIZER, 2, timeout=120)

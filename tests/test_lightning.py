"""horovodlike.lightning.HorovodStrategy: a Lightning 2.x Trainer on 2 ranks.

Each rank starts from different weights, trains a float64 linear model for two epochs
with SGD + momentum under the strategy, and compares its parameters with a plain torch
loop in one process over the global batch (both ranks' samples, at the learning rate
the strategy scales by the number of ranks); then again with two accumulated
micro-batches per step and scale_lr=False. Equal parameters show the sampler split,
the initial broadcast, the averaged gradients and the optimizer wrapping together; the
script also checks the logged metric's reduction, rank-zero-only checkpoints and logs.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program, run_ranks

pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")
pytest.importorskip("torch", reason="torch is not installed")
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

SCRIPT = rank_program("lightning_training")


@pytest.mark.parametrize("launcher,np", launcher_matrix([("horovodlikerun", 2),
                                                         ("mpirun", 2)]))
def test_two_ranks_match_one_process_over_the_global_batch(launcher, np, tmp_path):
    res = run_ranks(SCRIPT, np=np, launcher=launcher, timeout=240, args=(str(tmp_path),))
    res.assert_ok()

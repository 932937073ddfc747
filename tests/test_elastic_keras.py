"""(f) An elastic Keras model.fit with hvd.elastic's callbacks survives a SIGKILLed rank:
the job re-forms on the two hosts left, restores the last commit, and every rank ends
with bit-identical weights and optimizer state."""

import pytest

from elastic_support import records, run_elastic
from harness import rank_program
from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

SCRIPT = rank_program("elastic_keras_script")


@pytest.mark.timeout(105)        # 36 s on a loaded 2-core machine
def test_keras_fit_survives_a_killed_rank(tmp_path):
    res = run_elastic(SCRIPT, tmp_path, "a:1\nb:1\nc:1\n", 3, 2, 3, env=TF_ENV, timeout=90)
    assert res.returncode == 0, res.describe()
    assert "fault kill worker=2" in res.stdout, res.describe()
    finals = [r for _, r in records(res, "final")]
    assert len(finals) == 2 and {f["size"] for f in finals} == {"2"}, res.describe()
    assert {f["epoch"] for f in finals} == {"4"}, finals
    assert len({f["hash"] for f in finals}) == 1, finals
    assert float(finals[0]["acc"]) > 0.8, finals
    starts = records(res, "start")
    # the fit after the kill resumes epoch 1 on both survivors from the same state
    after = [r for _, r in starts if r["size"] == "2"]
    assert len(after) == 2 and {r["epoch"] for r in after} == {"1"}, starts
    assert len({r["hash"] for r in after}) == 1, after

"""The PyTorch examples, run as users run them: under horovodlikerun and mpirun (and
plain python for the digits example), checking what they print."""
import importlib.util
import re

import pytest

from harness import REPO, launcher_matrix, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

BENCHMARK = REPO / "examples" / "pytorch_synthetic_benchmark.py"
DIGITS = REPO / "examples" / "pytorch_digits.py"
QUICK_BENCH = ["--num-warmup-batches", "2", "--num-batches-per-iter", "3", "--num-iters", "2"]


@pytest.mark.parametrize("launcher,np_,args", [
    pytest.param("horovodlikerun", 2, QUICK_BENCH, id="horovodlikerun-np2-resnet"),
    pytest.param("mpirun", 2, QUICK_BENCH + ["--model", "mlp", "--fp16-allreduce"],
                 id="mpirun-np2-mlp-fp16",
                 marks=launcher_matrix([("mpirun", 2)])[0].marks),
])
def test_synthetic_benchmark(launcher, np_, args):
    res = run_ranks(BENCHMARK, np_, launcher, timeout=180, args=args)
    assert res.returncode == 0, res.describe()
    lines = res.rank_lines()
    for r in range(np_):
        assert any(re.match(rf"Rank {r}: img/sec per CPU: [\d.]+ \+-[\d.]+", l)
                   for l in lines.get(r, [])), res.describe()
    total = [l for l in lines.get(0, []) if l.startswith(f"Total img/sec on {np_} CPU(s):")]
    assert total and float(total[0].split(":")[1].split()[0]) > 0, res.describe()
    assert any(l.startswith("Iter #1:") for l in lines[0]), res.describe()


def test_synthetic_benchmark_adasum_fails_cleanly():
    res = run_ranks(BENCHMARK, 1, "python", timeout=120, args=QUICK_BENCH + ["--use-adasum"])
    assert res.returncode != 0
    assert "NotImplementedError" in res.stderr and "Adasum" in res.stderr, res.describe()


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("mpirun", 2), ("python", 1),
                                                          ("horovodlikerun", 4)]))
def test_digits_reaches_90_percent(launcher, np_, tmp_path):
    res = run_ranks(DIGITS, np_, launcher, timeout=240,
                    args=["--checkpoint-dir", str(tmp_path)])
    assert res.returncode == 0, res.describe()
    result = [l for l in res.rank_lines().get(0, []) if l.startswith("RESULT ")]
    assert result, res.describe()
    fields = dict(kv.split("=") for kv in result[-1].split()[1:])
    assert float(fields["accuracy"]) > 0.90, f"accuracy {fields}\n{res.describe()}"
    assert fields["identical"] == "1", res.describe()
    assert sorted(p.name for p in tmp_path.iterdir())[-1].startswith("checkpoint-"), \
        "rank 0 wrote no checkpoint"
    assert (tmp_path / "checkpoint-20.pt").exists(), sorted(tmp_path.iterdir())

"""horovodlike.run(fn, ...): Horovod's horovod.run on real 2-rank jobs."""
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import horovodlike  # noqa: E402
from harness import MPIRUN_SKIP_REASON, rank_program  # noqa: E402

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(180)


# Module-level functions: the ranks import this module to find them.
def allreduce_rank(scale, offset=0.0):
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "value": float(total[0]) * scale + offset,
            "pid": os.getpid(), "dir_mode": os.stat(sys.argv[1]).st_mode & 0o777}


def fail_on_rank_one():
    import horovodlike as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("rank one has no key")
    hvd.barrier()
    return "unreachable for the job"


def killed_on_rank_one():
    if os.environ.get("HOROVOD_RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return "rank 0 done"


def unpicklable_result():
    return lambda: None


@pytest.fixture
def run_dirs(monkeypatch):
    """Record the private directories run() makes, to check they are removed."""
    made = []
    real = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        path = real(*a, **kw)
        made.append(path)
        return path
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return made


def test_results_come_back_in_rank_order(run_dirs):
    out = horovodlike.run(allreduce_rank, args=(2.0,), kwargs={"offset": 0.5}, num_proc=2)
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["size"] == 2 and r["value"] == 6.5 for r in out)
    assert len({r["pid"] for r in out} | {os.getpid()}) == 3      # really other processes
    assert run_dirs and not any(os.path.exists(d) for d in run_dirs)
    assert {r["dir_mode"] for r in out} == {0o700}                # private to this user


def test_failing_rank_raises_naming_it(run_dirs):
    with pytest.raises(RuntimeError) as exc:
        horovodlike.run(fail_on_rank_one, num_proc=2)
    msg = str(exc.value)
    assert msg.startswith("horovodlike.run: rank 1 raised KeyError: 'rank one has no key'")
    assert "fail_on_rank_one" in msg and "Traceback" in msg      # the rank's traceback
    assert not any(os.path.exists(d) for d in run_dirs)


def test_rank_killed_by_a_signal_is_named():
    with pytest.raises(RuntimeError) as exc:
        horovodlike.run(killed_on_rank_one, num_proc=2)
    assert "rank 1" in str(exc.value) and "SIGKILL" in str(exc.value), str(exc.value)


def test_unpicklable_things_are_clear_errors():
    if importlib.util.find_spec("cloudpickle") is None:
        with pytest.raises(ValueError, match="picklable"):
            horovodlike.run(lambda: 1, num_proc=1)
    with pytest.raises(RuntimeError, match="rank 0 raised"):
        horovodlike.run(unpicklable_result, num_proc=1)


def test_arguments_checked_like_horovod(tmp_path):
    with pytest.raises(NotImplementedError, match="min_num_proc.*elastic"):
        horovodlike.run(allreduce_rank, num_proc=2, min_num_proc=1)
    with pytest.raises(ValueError, match="hosts and hostfile"):
        horovodlike.run(allreduce_rank, hosts="localhost:2", hostfile=str(tmp_path / "h"))
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        horovodlike.run(allreduce_rank, use_gloo=True, use_mpi=True)
    with pytest.warns(DeprecationWarning, match="np is deprecated"):
        out = horovodlike.run(allreduce_rank, args=(1.0,), np=1)
    assert out[0]["value"] == 1.0 and out[0]["size"] == 1
    assert horovodlike.runner.run is horovodlike.run


def test_function_defined_in_the_script_being_run(tmp_path):
    script = rank_program("launch_run_main_function")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert "RESULTS [[0, 30.0], [1, 30.0]]" in res.stdout


@pytest.mark.skipif(MPIRUN_SKIP_REASON is not None, reason=MPIRUN_SKIP_REASON or "")
def test_use_mpi_runs_through_mpirun():
    out = horovodlike.run(allreduce_rank, args=(1.0,), num_proc=2, use_mpi=True,
                          mpi_args="--oversubscribe")
    assert [(r["rank"], r["value"]) for r in out] == [(0, 3.0), (1, 3.0)]

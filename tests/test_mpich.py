"""horovodlike under MPICH's mpiexec (Hydra), with mpi4py on MPICH.

MPICH comes from its PyPI wheel, installed by scripts/setup.sh --test into a prefix of
its own (never the venv, whose mpirun stays Open MPI's). mpi4py's wheel carries both
ABIs; MPI4PY_LIBMPI names MPICH's library, so the same mpi4py runs on MPICH here. The
prefix is HOROVODLIKE_MPICH_PREFIX, or the cache folder setup.sh uses by default.

  * `mpiexec -n 4 python` of the torch training script trains in step, on MPICH;
  * a rank SIGSTOPped mid-training: the others name it within the peer timeout and end
    the job (MPI_Abort), which would otherwise wait for it for ever;
  * `horovodlikerun --mpi` builds a command line Hydra runs, --output-filename giving
    each rank its own files.
"""
import glob
import os
import re
import socket
import subprocess

import pytest

from harness import rank_program
from hpc_support import (MPICH_LIBMPI, MPICH_MPIEXEC, MPICH_PIN, MPICH_PREFIX, MPICH_SHM,
                         PEER_TIMEOUT, rank_env, remove_mpich_shm, run_watched)

TRAIN = rank_program("hpc_train")
NODE = socket.gethostname()
JOB_TIMEOUT = 150


PREFIX, LIBMPI, MPIEXEC = MPICH_PREFIX, MPICH_LIBMPI, MPICH_MPIEXEC


def _unavailable():
    if not (os.access(MPIEXEC, os.X_OK) and os.path.exists(LIBMPI)):
        return (f"MPICH is not installed in {PREFIX} (scripts/setup.sh --test installs "
                f"{MPICH_PIN} there)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    return None


REASON = _unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def mpich_shm():
    """What MPICH left in /dev/shm during the test (removed after it)."""
    before = set(glob.glob(MPICH_SHM))
    left = {}
    yield lambda: left.setdefault("left", remove_mpich_shm(before))
    remove_mpich_shm(before)


def _env(**extra):
    env = rank_env(os.environ, MPI4PY_LIBMPI=LIBMPI, **extra)
    env["PATH"] = os.path.join(PREFIX, "bin") + os.pathsep + env["PATH"]
    return env


def _ok_ranks(text):
    return sorted(int(m) for m in re.findall(r"HVDTEST-OK rank=(\d+)", text))


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_mpiexec_of_four_torch_ranks_trains_in_step_on_mpich(mpich_shm):
    res = run_watched([MPIEXEC, "-n", "4", "python", str(TRAIN)], _env(), JOB_TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert not mpich_shm(), "a job that ended well left MPICH's shared memory behind"
    assert _ok_ranks(res.output) == [0, 1, 2, 3], res.describe()
    for r in range(4):
        assert f"launch=mpi rank={r} size=4 local={r}/4" in res.output, res.describe()
    assert "mpi=MPICH" in res.output, res.describe()


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_mpiexec_with_a_stopped_rank_ends_within_the_peer_timeout_naming_it(mpich_shm):
    """Hydra ends a job when a process dies, but not while one is stopped: the others
    must name it and call MPI_Abort."""
    res = run_watched([MPIEXEC, "-n", "3", "python", str(TRAIN), "stop", "1"], _env(),
                      JOB_TIMEOUT)
    assert res.returncode != 0, res.describe()
    lost = res.first(f"rank 1 (host {NODE}) was lost")
    midway = res.first("midway 1")
    assert lost is not None and midway is not None, res.describe()
    assert "ending the MPI job (MPI_Abort)" in res.output, res.describe()
    assert lost - midway < PEER_TIMEOUT + 10, res.describe()
    assert res.elapsed - midway < PEER_TIMEOUT + 20, res.describe()


RANK_LINE = ("import horovodlike as hvd; hvd.init(); "
             "print(f'rank {hvd.rank()} of {hvd.size()} mpi={hvd.mpi_enabled()}')")


@pytest.mark.timeout(120)
def test_horovodlikerun_mpi_runs_hydra_with_a_file_per_rank(tmp_path, mpich_shm):
    out = tmp_path / "logs"
    res = run_watched(["horovodlikerun", "--mpi", "-np", "2", "--verbose",
                       "--output-filename", str(out), "python", "-c", RANK_LINE],
                      _env(), 90, cwd=str(tmp_path))
    assert res.returncode == 0, res.describe()
    assert "mpirun -l -np 2" in res.output, res.describe()     # Hydra's flavour was seen
    for r in range(2):
        text = (out / f"rank.{r}" / "stdout").read_text()
        # Hydra's -l labels come along, one per piece of output it reads: an unbuffered
        # print's text and newline are two ("[r] rank r of 2 ...[r] \n").
        assert text.startswith(f"[{r}] "), (r, text, res.describe())
        assert re.sub(r"\[\d+\] ", "", text).strip() == f"rank {r} of 2 mpi=True", \
            (r, text, res.describe())
    assert not (out / "rank.%r").exists()


def test_mpich_is_not_on_the_venvs_path():
    """The Open MPI path stays as it was: the venv's mpirun is Open MPI's."""
    env = rank_env(os.environ)
    ver = subprocess.run(["mpirun", "--version"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert "Open MPI" in ver.stdout + ver.stderr, ver.stdout + ver.stderr

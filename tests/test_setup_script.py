"""scripts/setup.sh: safe to source, shows its progress, installs only what is asked.

Every run here is --dry-run against a virtual environment that does not exist (and a
PYTHON that cannot make one), so nothing is installed: the plan it prints is checked.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"

pytestmark = pytest.mark.timeout(60)


def _bash(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW")}
    env.update(HOROVODLIKE_VENV=str(tmp_path / "no-venv"), PYTHON="/bin/false")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         timeout=50, cwd=tmp_path)
    assert not (tmp_path / "no-venv").exists()
    return res


def test_sourcing_leaves_only_the_environment_in_the_shell(tmp_path):
    res = _bash(f'. "{SETUP}" --dry-run; '
                'echo "flags=$-"; shopt -qo pipefail && echo pipefail=on; '
                'declare -F _horovodlike_setup >/dev/null && echo leaked-function; '
                'echo "path=$PATH"; echo "ompi=$OMPI_ALLOW_RUN_AS_ROOT"; '
                'echo "unset=$NOT_SET_ANYWHERE"', tmp_path)
    assert res.returncode == 0, res.stderr
    flags = next(line for line in res.stdout.splitlines() if line.startswith("flags="))
    assert "e" not in flags[6:] and "u" not in flags[6:], flags
    assert "pipefail=on" not in res.stdout and "leaked-function" not in res.stdout
    assert f"path={tmp_path / 'no-venv' / 'bin'}:" in res.stdout
    assert "ompi=1" in res.stdout and "unset=" in res.stdout


def test_a_failure_returns_to_the_shell_instead_of_closing_it(tmp_path):
    res = _bash(f'. "{SETUP}" --no-such-option; echo "still here, status $?"', tmp_path)
    assert "unknown option --no-such-option" in res.stderr
    assert "still here, status 2" in res.stdout, res.stdout + res.stderr


def test_the_demo_gets_the_library_only_and_sees_progress(tmp_path):
    out = _bash(f'. "{SETUP}" --dry-run', tmp_path).stdout
    steps = [line for line in out.splitlines() if line.startswith("setup: [")]
    assert [s[:12] for s in steps] == ["setup: [1/3]", "setup: [2/3]", "setup: [3/3]"], out
    assert "torch==" in out and "scikit-learn==" in out
    for unneeded in ("chromium", "aarch64", "pyspark==", "pytest==", "pytorch-lightning==",
                     "ruff==", "clang-format=="):
        assert unneeded not in out, unneeded


def test_the_tests_get_their_tools_and_packages(tmp_path):
    out = _bash(f'. "{SETUP}" --test --dry-run', tmp_path).stdout
    assert "setup: [1/5] system tools for the tests" in out
    assert "chromium" in out and "gcc-aarch64-linux-gnu" in out
    assert "slurm-wlm" in out and "munge" in out
    assert "setup: [4/5] MPICH (mpich==5.0.2)" in out
    for pin in ("pyspark==4.3.0", "pytorch-lightning==2.6.6", "pytest==", "ray==", "ruff==",
                "clang-format=="):
        assert pin in out, pin

"""scripts/setup.sh: safe to source, shows its progress, installs only what is asked.

Every run here is --dry-run against a virtual environment that does not exist (and a
PYTHON that cannot make one), so nothing is installed: the plan it prints is checked.
Where torch comes from is decided without the network: the CPU index is a server on
loopback (or a closed loopback port), `nvidia-smi` and the venv's pip are stubs.
"""
import http.server
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"

pytestmark = pytest.mark.timeout(60)


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]       # nobody listens there once it is closed


def _stub(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _bash(script, tmp_path, venv=None, gpu=False, **env_extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_ALLOW", "HOROVODLIKE_TORCH"))}
    # nvidia-smi as on a machine without (or with) a GPU, whatever this one has
    bindir = tmp_path / "stub-bin"
    _stub(bindir / "nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'" if gpu else "exit 9")
    env.update(HOROVODLIKE_VENV=str(venv or tmp_path / "no-venv"), PYTHON="/bin/false",
               PATH=f"{bindir}:{env['PATH']}",
               HOROVODLIKE_TORCH_CPU_INDEX=f"http://127.0.0.1:{_closed_port()}/whl/cpu")
    env.update(env_extra)
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


# ------------------------------------------------------- where torch comes from

TORCH = next(line.split("#")[0].strip() for line in (ROOT / "requirements.txt").open()
             if line.startswith("torch=="))


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):                   # a simple index's page for torch, and 404 else
        ok = self.path.rstrip("/").endswith("/whl/cpu/torch")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args):
        pass


@pytest.fixture
def cpu_index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


def _venv_with_pip(tmp_path, version):
    """A venv whose pip, asked for the pin without an index, reports `version` (or
    finds nothing when None); every other use fails, so every pin counts as missing."""
    report = (f'echo \'{{"install": [{{"metadata": {{"name": "torch", "version": "{version}"}}}}]}}\''
              if version else "exit 1")
    _stub(tmp_path / "venv" / "bin" / "python",
          f'case "$*" in *"--no-index"*"--report"*) {report} ;; *) exit 1 ;; esac')
    return tmp_path / "venv"


def _torch_lines(out):
    return [line for line in out.splitlines() if "torch" in line and "setup:" in line]


def test_without_cuda_torch_comes_from_pytorchs_cpu_index(tmp_path, cpu_index):
    res = _bash(f'. "{SETUP}" --dry-run', tmp_path, HOROVODLIKE_TORCH_CPU_INDEX=cpu_index)
    assert res.returncode == 0, res.stderr
    assert f"no CUDA here; the CPU build of {TORCH} from {cpu_index}" in res.stdout
    assert f"install --progress-bar on --index-url {cpu_index} {TORCH}" in res.stdout


def test_without_cuda_a_local_cpu_wheel_is_used_offline(tmp_path, cpu_index):
    venv = _venv_with_pip(tmp_path, TORCH.split("==")[1] + "+cpu")
    out = _bash(f'. "{SETUP}" --dry-run', tmp_path, venv=venv,
                HOROVODLIKE_TORCH_CPU_INDEX=cpu_index).stdout
    assert f"no CUDA here; the CPU build of {TORCH} is on this machine" in out, out
    lines = _torch_lines(out)
    assert any(line.endswith(f"install --progress-bar on {TORCH}") for line in lines), lines
    assert "--index-url" not in out


def test_a_local_cuda_wheel_is_not_taken_for_the_cpu_build(tmp_path, cpu_index):
    venv = _venv_with_pip(tmp_path, TORCH.split("==")[1])
    out = _bash(f'. "{SETUP}" --dry-run', tmp_path, venv=venv,
                HOROVODLIKE_TORCH_CPU_INDEX=cpu_index).stdout
    assert f"--index-url {cpu_index} {TORCH}" in out, out


def test_without_cuda_or_the_cpu_index_setup_says_so_and_stops(tmp_path):
    res = _bash(f'. "{SETUP}" --dry-run', tmp_path)
    assert "cannot be reached" in res.stderr and "CUDA build (several GB)" in res.stderr, \
        res.stderr
    assert "HOROVODLIKE_TORCH_CUDA=1" in res.stderr
    assert not any(line.endswith(f" {TORCH}") for line in _torch_lines(res.stdout)), \
        res.stdout
    # a real run stops there, before installing anything
    venv = _venv_with_pip(tmp_path, None)
    res = _bash(f'. "{SETUP}"; echo "status $?"', tmp_path, venv=venv)
    assert "status 1" in res.stdout and "cannot be reached" in res.stderr, res.stdout


def test_with_cuda_torch_comes_from_the_default_index(tmp_path, cpu_index):
    out = _bash(f'. "{SETUP}" --dry-run', tmp_path, gpu=True,
                HOROVODLIKE_TORCH_CPU_INDEX=cpu_index).stdout
    assert f"this machine has CUDA: {TORCH} from the default index" in out, out
    assert "--index-url" not in out

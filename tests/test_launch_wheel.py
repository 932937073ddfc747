"""The package as users get it: `python -m build` makes an sdist and a wheel with the
engine's sources, and the wheel installed into a fresh venv outside the checkout runs
`horovodlikerun --version`, `--check-build` and a 2-rank job."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("build") is None,
                                 reason="the 'build' package is not installed")]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(900))


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith(("HOROVOD", "OMPI_COMM_WORLD", "PMI", "RANK", "WORLD_SIZE"))}
    env.update(extra)
    return env


def _run(argv, cwd, timeout=600, **env):
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=_clean_env(**env))
    assert res.returncode == 0, f"$ {' '.join(map(str, argv))}\n{res.stdout}\n{res.stderr}"
    return res


def _copy_checkout(dest):
    """The files a clean clone would have (tracked and new, not ignored)."""
    try:
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"],
                               cwd=REPO, capture_output=True, check=True).stdout
        files = [n for n in names.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in files:
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_wheel_builds_installs_and_runs_outside_the_checkout(tmp_path):
    src, dist = tmp_path / "src", tmp_path / "dist"
    _copy_checkout(src)
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist),
                  str(src)], cwd=tmp_path)
    # No compiler or setuptools warning in the build's output (setuptools' notice that
    # PYTHONDONTWRITEBYTECODE, set in some environments, turns byte-compiling off is not
    # about the package).
    noise = [line for line in (built.stdout + built.stderr).splitlines()
             if re.search(r"warning", line, re.I)
             and "byte-compiling is disabled" not in line]
    assert not noise, "\n".join(noise)

    sdist = next(dist.glob("horovodlike-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert any(n.endswith("/engine/include/horovodlike.h") for n in names), names
    assert sum(n.endswith(".c") and "/engine/coll/" in n for n in names) >= 5
    wheel = next(dist.glob("horovodlike-*.whl"))
    # The extension uses only the stable ABI (cffi's Py_LIMITED_API): one wheel for
    # every CPython from 3.9 on.
    assert re.search(r"-cp39-abi3-[a-z0-9_]+\.whl$", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for extra in ("torch", "tensorflow", "ray", "spark", "lightning", "viewer"):
        assert f"Provides-Extra: {extra}" in meta, extra
    assert re.search(r"^License(-Expression)?: Apache-2\.0$", meta, re.M), meta[:2000]
    assert re.search(r"^Summary: Horovod's API", meta, re.M)
    assert "Classifier: Topic :: System :: Distributed Computing" in meta
    assert "Project-URL: " in meta and "Description-Content-Type: text/markdown" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names), names
    # Only the horovodlike package: the viewer lives inside it.
    assert {n.split("/")[0] for n in names if not n.startswith("horovodlike-")} \
        == {"horovodlike"}, sorted(names)
    assert "horovodlike/timeline_viewer/static/viewer.js" in names
    assert any(re.match(r"horovodlike/_engine.*\.so$", n) for n in names), names
    assert any(n.endswith("share/horovodlike/engine/include/horovodlike.h") for n in names)
    assert "horovodlike/runner/args.py" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    bin_dir = venv / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q",
          "--disable-pip-version-check", str(wheel)], cwd=tmp_path)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    path = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    from horovodlike import __version__
    res = _run([str(bin_dir / "horovodlikerun"), "--version"], cwd=outside, PATH=path)
    assert res.stdout.strip() == __version__
    res = _run([str(bin_dir / "horovodlikerun"), "--check-build"], cwd=outside, PATH=path)
    assert "Available Frameworks:" in res.stdout
    assert "[X] compiled engine loads" in res.stdout
    # The viewer's command; this venv has no matplotlib, so --png says what to install.
    png = subprocess.run([str(bin_dir / "horovodlike-timeline"), "none.json", "--png",
                          "t.png"], cwd=outside, capture_output=True, text=True,
                         timeout=120, env=_clean_env(PATH=path))
    assert png.returncode == 2 and "--png needs matplotlib" in png.stderr \
        and "Traceback" not in png.stderr, png.stderr
    job = ("import horovodlike as hvd, numpy as np; hvd.init(); "
           "print('at', hvd.__file__, 'sum', hvd.allreduce(np.full(3, hvd.rank() + 1.0), "
           "op=hvd.Sum).tolist())")
    res = _run([str(bin_dir / "horovodlikerun"), "-np", "2", "python", "-c", job],
               cwd=outside, PATH=path, timeout=120)
    for rank in (0, 1):
        m = re.search(rf"^\[{rank}\]<stdout>:at (\S+) sum \[3\.0, 3\.0, 3\.0\]$", res.stdout,
                      re.M)
        assert m, res.stdout + res.stderr
        assert m.group(1).startswith(str(venv)), m.group(1)   # the installed copy

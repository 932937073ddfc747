"""The library speaks through logging.getLogger("horovodlike.*"), so an application, a
notebook or a service can route, format or silence its lines; only the commands
(horovodlikerun and its helpers, horovodlike-timeline) write to stdout/stderr directly."""
import ast
import logging
import os
import pathlib
import subprocess
import sys

from harness import rank_program

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "horovodlike"
PROGRAM = rank_program("logging_affinity")

# Modules that are commands (or a command's own process), whose output is the command's
# output: the launcher prints rank-prefixed lines and its own messages.
COMMANDS = {
    "runner/args.py", "runner/launch.py", "runner/elastic_driver.py", "runner/rank_shim.py",
    "runner/mpirun.py",
    "timeline_viewer/cli.py",
    # Keras's verbose=1 convention: the warmup callback prints as Horovod's does.
    "tensorflow/keras/callbacks.py",
}


def _direct_writes(path):
    """Lines of `path` that call print() or sys.stdout/sys.stderr.write()."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            lines.append(node.lineno)
        elif (isinstance(f, ast.Attribute) and f.attr == "write"
              and isinstance(f.value, ast.Attribute) and f.value.attr in ("stdout", "stderr")
              and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys"):
            lines.append(node.lineno)
    return lines


def test_library_modules_log_instead_of_printing():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in COMMANDS:
            lines = _direct_writes(path)
            if lines:
                found[rel] = lines
    assert not found, f"print()/sys.std*.write() in library modules (use logging): {found}"


def test_affinity_problem_is_a_warning_of_the_horovodlike_logger(monkeypatch, caplog):
    from horovodlike.common.affinity import engine_thread_affinity
    monkeypatch.setenv("HOROVOD_THREAD_AFFINITY", "not,cores")
    with caplog.at_level(logging.WARNING, logger="horovodlike"):
        with engine_thread_affinity(0, 1) as core:
            assert core is None
    [record] = [r for r in caplog.records if r.name.startswith("horovodlike.")]
    assert record.name == "horovodlike.affinity" and record.levelno == logging.WARNING
    assert "not a list of core ids" in record.getMessage()


def test_shown_by_default_and_silenced_through_the_logger():
    """With no logging configured the line still reaches stderr (Python's last-resort
    handler: WARNING and up, the bare message); setting the "horovodlike" logger's level
    silences it."""
    env = {**os.environ, "HOROVOD_THREAD_AFFINITY": "not,cores",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    loud, quiet = (subprocess.run([sys.executable, str(PROGRAM), mode], env=env, timeout=60,
                                  capture_output=True, text=True) for mode in ("loud", "quiet"))
    assert loud.stderr == ("horovodlike: HOROVOD_THREAD_AFFINITY='not,cores' is not a list "
                           "of core ids; the background thread is not pinned\n"), loud.stderr
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr

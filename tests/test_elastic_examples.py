"""The two elastic examples under horovodlikerun on three fake hosts, with one worker
killed from outside (SIGKILL to the pid it printed, as a person would): each finishes on
the two hosts left with identical parameters on every rank."""
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from elastic_support import FAKE_NODES
from harness import HOROVODLIKERUN, PYTHON, REPO, _env, kill_tree

EXAMPLES = REPO / "examples" / "elastic"


def _run_and_kill(tmp_path, example, args, timeout, env=None):
    (tmp_path / "hosts.txt").write_text("node1:1\nnode2:1\nnode3:1\n")
    head = [HOROVODLIKERUN] if HOROVODLIKERUN else [PYTHON, "-m", "horovodlike.runner"]
    argv = [*head, "-np", "3", "--min-np", "2", "--max-np", "3",
            "--host-discovery-script", str(EXAMPLES / "discover_hosts.sh"), *FAKE_NODES,
            PYTHON, str(EXAMPLES / example), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env("horovodlikerun", env), cwd=str(tmp_path),
                            start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    out, victim, killed = [], None, False
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("timed out:\n" + "".join(out[-60:])) from None
            if line is None:
                break
            out.append(line)
            if "worker on node3: pid " in line:
                victim = int(line.rsplit("pid ", 1)[1].split(",")[0])
            if not killed and victim and "epoch 1:" in line:
                os.kill(victim, signal.SIGKILL)
                killed = True
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
            proc.wait()
    text = "".join(out)
    assert killed, text
    assert proc.returncode == 0, text
    assert "blacklisting host node3" in text and "round 1: 2 ranks" in text, text
    return [line for line in out if "done: rank" in line], text


@pytest.mark.timeout(115)        # 39 s on a loaded 2-core machine
def test_pytorch_example_survives_a_kill(tmp_path):
    done, text = _run_and_kill(tmp_path, "pytorch_digits_elastic.py",
                               ["--epochs", "4", "--batch-sleep", "0.02"], timeout=80)
    assert len(done) == 2 and all("of 2," in d for d in done), text
    assert len({d.rsplit("sha256 ", 1)[1] for d in done}) == 1, done
    assert "epoch 3:" in text


@pytest.mark.timeout(145)        # 49 s on a loaded 2-core machine
def test_keras_example_survives_a_kill(tmp_path):
    from tf_support import TF_ENV
    done, text = _run_and_kill(tmp_path, "tensorflow2_keras_digits_elastic.py",
                               ["--epochs", "4", "--steps-per-epoch", "20",
                                "--batch-sleep", "0.02"], timeout=110, env=TF_ENV)
    assert len(done) == 2 and all("of 2," in d for d in done), text
    assert len({d.rsplit("sha256 ", 1)[1] for d in done}) == 1, done
    assert "epoch 4:" in text or "epoch 3:" in text

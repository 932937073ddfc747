"""Messages that say what to do: each misuse a newcomer meets first gets text that
names the problem in the user's terms (parameters, launcher flags, ranks), checked
word for word here by causing it for real."""
import importlib.util

import pytest

from harness import rank_program, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

BUCKETS = rank_program("misuse_messages_buckets")


def test_bucketed_optimizer_names_the_parameters_that_differ():
    run_ranks(BUCKETS, 2, "horovodlikerun", timeout=90).assert_ok()


LATE = rank_program("misuse_messages_late")


def test_start_timeout_names_the_flag_and_calls_a_late_rank_late():
    res = run_ranks(LATE, 2, "horovodlikerun", launcher_args=["--start-timeout", "3"],
                    timeout=60)
    assert "[0]<stdout>:HVDTEST-OK" in res.stdout, res.describe()
    assert res.returncode != 0, res.describe()
    blamed = [line for line in res.stderr.splitlines() if line.startswith("horovodlikerun:")]
    assert blamed and "was late, as rank 0 reported" in blamed[0], res.describe()


def test_one_host_kubeflow_style_environment_is_not_called_several_hosts():
    from horovodlike.common import launch_env
    kubeflow = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    le = launch_env.detect(dict(kubeflow, MASTER_ADDR="127.0.0.1"))
    assert (le.local_rank, le.local_size) == (1, 2), le     # one host: the key file way
    remote = launch_env.detect(dict(kubeflow, MASTER_ADDR="10.255.0.1"))
    with pytest.raises(RuntimeError) as info:
        launch_env.job_key(remote, dict(kubeflow, MASTER_ADDR="10.255.0.1"))
    assert "may span hosts (world size 2; the environment does not say how many run on " \
           "this host: LOCAL_WORLD_SIZE is unset)" in str(info.value)
    assert "unknown on this host" not in str(info.value)


IGNORED_ENV = rank_program("misuse_messages_ignored_env")


def test_ineffective_horovod_variables_get_one_notice_at_init():
    env = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_GPU_OPERATIONS": "NCCL",
           "HOROVOD_CYCLE_TIME": "2", "HOROVOD_AUTOTUNE": "1"}   # the last two have effects
    res = run_ranks(IGNORED_ENV, 1, "python", env=env, timeout=60)
    res.assert_ok()
    lines = [line for line in res.stderr.splitlines() if "have no effect" in line]
    assert len(lines) == 1, res.describe()
    for needle in ("HOROVOD_CONTROLLER (", "HOROVOD_GPU_OPERATIONS ("):
        assert needle in lines[0], lines[0]
    assert "HOROVOD_CYCLE_TIME (" not in lines[0] and "AUTOTUNE" not in lines[0], lines[0]


INTERRUPTED = rank_program("misuse_messages_interrupted")


def test_ctrl_c_prints_one_line_per_rank():
    import queue
    import signal
    import subprocess
    import sys
    import threading
    from harness import _env, kill_tree
    proc = subprocess.Popen([sys.executable, "-m", "horovodlike.runner", "-np", "2",
                             sys.executable, str(INTERRUPTED)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env("horovodlikerun", {}),
                            start_new_session=True)
    lines = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    try:
        ready = 0
        while ready < 2:
            ready += "<stdout>:ready" in lines.get(timeout=60)
        proc.send_signal(signal.SIGINT)          # Ctrl-C at the launcher
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read()
    finally:
        kill_tree(proc)
    reader.join(timeout=10)              # the rank lines come through the launcher's stdout
    while not lines.empty():
        err += lines.get()
    assert "Traceback" not in err, err
    for r in (0, 1):
        assert err.count(f"horovodlike rank {r}: interrupted (Ctrl-C); exiting") == 1, err


TF_COMPOSITE = rank_program("misuse_messages_tf_composite")


def test_tf_ragged_and_sparse_tensors_get_a_clear_error():
    run_ranks(TF_COMPOSITE, 1, "python", timeout=90).assert_ok()

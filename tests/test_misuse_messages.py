"""Messages that say what to do: each misuse a newcomer meets first gets text that
names the problem in the user's terms (parameters, launcher flags, ranks), checked
word for word here by causing it for real."""
import importlib.util

import pytest

from harness import RANK_PRELUDE, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

BUCKETS = RANK_PRELUDE + r'''
import torch
import horovodlike.torch as hvdt
hvdt.init()
R = hvdt.rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 4 + R)             # rank 1 built a different model
opt = hvdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters())
model(torch.ones(2, 4)).sum().backward()
e = check_raises(hvdt.TensorMismatchError, opt.step,
                 "the model's parameters differ across ranks",
                 "'weight': rank 0 has [4, 4], rank 1 has [5, 4]",
                 "'bias': rank 0 has [4], rank 1 has [5]", what="step() with different models")
check("bucket" not in str(e).split("(")[0], "no bucket name in the message", str(e))
# the engine goes on: a following collective works
check_equal(hvdt.allreduce(torch.ones(2), op=hvdt.Sum, name="after").numpy(),
            np.full(2, 2.0, dtype=np.float32), "an allreduce after the mismatch")
finish()
'''


def test_bucketed_optimizer_names_the_parameters_that_differ():
    run_ranks(BUCKETS, 2, "horovodlikerun", timeout=90).assert_ok()


LATE = RANK_PRELUDE + r'''
if os.environ["HOROVOD_RANK"] == "1":
    time.sleep(30)           # a rank far slower to start than --start-timeout allows
try:
    hvd.init()
    fail("init with a late rank", "returned")
except RuntimeError as e:
    for needle in ("rank 1 is late: it did not reach hvd.init() within 3 s",
                   "horovodlikerun --start-timeout"):
        check(needle in str(e), "the start timeout message", f"{str(e)!r} lacks {needle!r}")
    check("was lost" not in str(e), "a late rank is not called lost", str(e))
    print(f"RuntimeError: {e}", file=sys.stderr, flush=True)   # as an uncaught one would
    finish_alone()
    sys.exit(1)              # the job failed: the launcher says why
'''


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


IGNORED_ENV = RANK_PRELUDE + r'''
hvd.init()
hvd.shutdown()
hvd.init()                   # a second init says nothing more
finish_alone()
'''


def test_ineffective_horovod_variables_get_one_notice_at_init():
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_GPU_OPERATIONS": "NCCL",
           "HOROVOD_CYCLE_TIME": "2"}     # the last one has its effect: not named
    res = run_ranks(IGNORED_ENV, 1, "python", env=env, timeout=60)
    res.assert_ok()
    lines = [line for line in res.stderr.splitlines() if "have no effect" in line]
    assert len(lines) == 1, res.describe()
    for needle in ("HOROVOD_AUTOTUNE (there is no autotuner", "HOROVOD_CONTROLLER (",
                   "HOROVOD_GPU_OPERATIONS ("):
        assert needle in lines[0], lines[0]
    assert "HOROVOD_CYCLE_TIME (" not in lines[0], lines[0]


INTERRUPTED = r'''
import time
import horovodlike as hvd
hvd.init()
print("ready", flush=True)
time.sleep(60)
'''


def test_ctrl_c_prints_one_line_per_rank():
    import os
    import queue
    import signal
    import subprocess
    import sys
    import tempfile
    import threading
    from harness import _env, kill_tree
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(INTERRUPTED)
    proc = subprocess.Popen([sys.executable, "-m", "horovodlike.runner", "-np", "2",
                             sys.executable, f.name], stdout=subprocess.PIPE,
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
        os.unlink(f.name)
    reader.join(timeout=10)              # the rank lines come through the launcher's stdout
    while not lines.empty():
        err += lines.get()
    assert "Traceback" not in err, err
    for r in (0, 1):
        assert err.count(f"horovodlike rank {r}: interrupted (Ctrl-C); exiting") == 1, err


TF_COMPOSITE = RANK_PRELUDE + r'''
import tensorflow as tf
import horovodlike.tensorflow as hvdtf
hvdtf.init()
ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
sparse = tf.sparse.SparseTensor([[0, 0]], [1.0], [2, 2])
for op, call in (("allreduce", lambda t: hvdtf.allreduce(t)),
                 ("allgather", lambda t: hvdtf.allgather(t)),
                 ("broadcast", lambda t: hvdtf.broadcast(t, 0))):
    check_raises(TypeError, lambda: call(ragged),
                 f"{op}: tf.RaggedTensor is not supported; use a dense tensor", what=f"{op} ragged")
    check_raises(TypeError, lambda: call(sparse),
                 f"{op}: tf.SparseTensor is not supported; use a dense tensor", what=f"{op} sparse")
finish()
'''


def test_tf_ragged_and_sparse_tensors_get_a_clear_error():
    run_ranks(TF_COMPOSITE, 1, "python", timeout=90).assert_ok()

"""horovodlike.ray.RayExecutor on a local Ray cluster: 2 actors train a torch model."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ray = pytest.importorskip("ray", reason="ray is not installed")
torch = pytest.importorskip("torch", reason="torch is not installed")

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

from horovodlike.common import jobkey  # noqa: E402
from horovodlike.common.store import StoreAuthError, StoreClient  # noqa: E402
from horovodlike.ray import BaseHorovodWorker, RayExecutor  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}})
    yield
    ray.shutdown()


def train(steps, lr):
    """A Horovod training function: init, broadcast, DistributedOptimizer."""
    import torch
    import horovodlike.torch as hvd
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())           # different start on every rank
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    true_w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 4, generator=gen)     # each rank its own shard of data
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w.T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"rank": hvd.rank(), "size": hvd.size(), "local": (hvd.local_rank(),
            hvd.local_size()), "weight": model.weight.detach().flatten().tolist(),
            "first": losses[0], "last": losses[-1]}


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


def test_executor_trains_on_two_actors(local_ray):
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1, use_gpu=False)
    executor.start()
    try:
        out = executor.run(train, args=[60], kwargs={"lr": 0.1})
        assert [r["rank"] for r in out] == [0, 1]
        assert all(r["size"] == 2 and r["local"] == (r["rank"], 2) for r in out)
        assert out[0]["weight"] == out[1]["weight"]     # kept in sync by the allreduce
        assert all(r["last"] < r["first"] / 10 for r in out), out
        assert out[0]["weight"] == pytest.approx([1.0, -2.0, 3.0, 0.5], abs=0.1)
        refs = executor.run_remote(train, args=[2], kwargs={"lr": 0.01})
        assert [r["rank"] for r in ray.get(refs)] == [0, 1]   # init again works
    finally:
        executor.shutdown()
    assert executor.workers == []


def test_executable_class_execute_and_execute_single(local_ray):
    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start(executable_cls=Counter, executable_args=[10])
    try:
        assert executor.execute(lambda c: c.bump()) == [11, 11]
        assert executor.execute_single(lambda c: c.bump()) == 12
        assert executor.execute(lambda c: c.value) == [12, 11]
        envs = executor.execute(lambda _: __import__("os").environ["HOROVOD_RANK"])
        assert envs == ["0", "1"]
        # Every actor holds the job's random key, carried by Ray; the store takes only it.
        keys = executor.execute(lambda _: __import__("os").environ[jobkey.ENV])
        assert keys[0] == keys[1] and len(jobkey.from_hex(keys[0])) == jobkey.KEY_BYTES
        assert os.environ.get(jobkey.ENV) != keys[0]
        address = executor.execute_single(
            lambda _: __import__("os").environ["HOROVODLIKE_STORE_ADDR"])
        with pytest.raises(StoreAuthError):
            StoreClient(address, key=jobkey.generate(), timeout=5)
        with StoreClient(address, key=jobkey.from_hex(keys[0]), timeout=5) as c:
            c.set("probe", b"ok")
    finally:
        executor.shutdown()
    other = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    other.start()
    try:                                   # a new job, a new key
        assert other.execute_single(lambda _: __import__("os").environ[jobkey.ENV]) != keys[0]
    finally:
        other.shutdown()


def test_failing_worker_raises_in_the_caller(local_ray):
    def fail(rank_to_fail):
        import os
        if os.environ["HOROVOD_RANK"] == str(rank_to_fail):
            raise ValueError("bad shard")
        return "ok"
    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start()
    try:
        with pytest.raises(ValueError, match="bad shard"):
            executor.run(fail, args=[1])
    finally:
        executor.shutdown()


def test_arguments_checked_like_horovod():
    settings = RayExecutor.create_settings()
    with pytest.raises(NotImplementedError, match="elastic"):
        RayExecutor(settings, min_workers=1, max_workers=2)
    with pytest.raises(ValueError, match="max_workers"):
        RayExecutor(settings, max_workers=2)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(settings, num_workers=2).run(train)
    assert issubclass(BaseHorovodWorker, object)

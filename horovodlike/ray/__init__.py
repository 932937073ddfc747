"""Ray integration with ``horovod.ray``'s API: ranks as Ray actors.

    from horovodlike.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train_fn)           # train_fn calls hvd.init() itself
    executor.shutdown()

Needs ``ray`` (``pip install ray``); importing this module without it raises ImportError
saying so.
"""
from .runner import BaseHorovodWorker, MiniSettings, RayExecutor

__all__ = ["RayExecutor", "BaseHorovodWorker", "MiniSettings"]

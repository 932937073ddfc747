"""``HorovodStrategy`` for PyTorch Lightning 2.x: what ``strategy="horovod"`` did in 1.x.

Lightning removed its Horovod strategy in 2.0. This one gives a Lightning 2.x ``Trainer``
the same behaviour on horovodlike's engine, with the ranks started by ``horovodlikerun``
or ``mpirun`` (one process per rank; Lightning starts no processes itself)::

    from horovodlike.lightning import HorovodStrategy
    trainer = pl.Trainer(strategy=HorovodStrategy(), accelerator="cpu", devices=1)
    trainer.fit(model, datamodule)       # horovodlikerun -np 4 python train.py

What it does, as Lightning 1.x's did:
  * data: Lightning puts a ``DistributedSampler`` (``num_replicas=hvd.size()``,
    ``rank=hvd.rank()``) on every dataloader (``is_distributed`` is True);
  * optimizers: each is wrapped in ``horovodlike.torch.DistributedOptimizer`` (named
    parameters, ``backward_passes_per_step`` = ``accumulate_grad_batches``), after the
    learning rate (and the schedulers' base rates) is multiplied by the number of ranks
    (``scale_lr=False`` keeps it as given);
  * start: the model's state and each optimizer's state are broadcast from rank 0;
  * output: ``rank_zero_only.rank`` is this rank, so loggers and progress bars write on
    rank 0 only, and checkpoints are saved by rank 0 only;
  * metrics: ``self.log(..., sync_dist=True)`` reduces with an allreduce (mean by
    default, or sum/max/min), ``all_gather`` is an allgather, ``broadcast`` a
    ``broadcast_object``, ``barrier`` a barrier.

Needs ``pytorch-lightning`` 2.x (the ``[lightning]`` extra: ``pip install ".[lightning]"``).
"""
import logging
import signal
from typing import Any, Optional

import torch

try:
    import pytorch_lightning as pl
    from lightning_fabric.plugins.environments.cluster_environment import ClusterEnvironment
    from lightning_fabric.utilities.types import ReduceOp
    from pytorch_lightning.core.optimizer import LightningOptimizer
    from pytorch_lightning.strategies.parallel import ParallelStrategy
    from pytorch_lightning.trainer.states import TrainerFn
    from pytorch_lightning.utilities.rank_zero import rank_zero_only
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("horovodlike.lightning needs PyTorch Lightning 2.x: pip install "
                      "pytorch-lightning (or the horovodlike[lightning] extra)") from exc

import horovodlike.torch as hvd

__all__ = ["HorovodStrategy", "HorovodEnvironment"]

log = logging.getLogger("horovodlike.lightning")

_REDUCE_OPS = {None: hvd.Average, "mean": hvd.Average, "avg": hvd.Average,
               ReduceOp.SUM: hvd.Sum, "sum": hvd.Sum, ReduceOp.MAX: hvd.Max, "max": hvd.Max,
               ReduceOp.MIN: hvd.Min, "min": hvd.Min}


# The engine's doorbell signal (engine/util/platform.h: HVDL_DOORBELL_SIG), whose handler the
# engine installs from C. Python's signal module still believes it is SIG_DFL, and the
# Trainer, at the end of every fit/validate/test/predict, "restores" every signal to what
# Python believes it was: that would put SIG_DFL back, and the next doorbell would kill
# the rank. teardown() takes this one signal out of what the Trainer restores.
_ENGINE_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else None


class HorovodEnvironment(ClusterEnvironment):
    """Who this process is, from horovodlike (started by horovodlikerun or mpirun)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True          # the launcher started every rank

    @property
    def main_address(self) -> str:
        return "127.0.0.1"   # unused: horovodlike rendezvouses on its own

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        return hvd.is_initialized()

    def world_size(self) -> int:
        return hvd.size()

    def set_world_size(self, size: int) -> None:
        if size != hvd.size():
            log.debug("Lightning asked for world size %d; the job has %d ranks",
                      size, hvd.size())

    def global_rank(self) -> int:
        return hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        pass                 # the launcher decided it

    def local_rank(self) -> int:
        return hvd.local_rank()

    def node_rank(self) -> int:
        return hvd.cross_rank()


class HorovodStrategy(ParallelStrategy):
    """Data-parallel training over horovodlike's ranks (Lightning 1.x's HorovodStrategy).

    Calls ``hvd.init()`` if the script has not. ``scale_lr`` (default True, as in 1.x):
    multiply each optimizer's learning rate by the number of ranks, for the larger
    global batch.
    """

    strategy_name = "horovod"

    def __init__(self, accelerator: Optional["pl.accelerators.Accelerator"] = None,
                 parallel_devices: Optional[list] = None, checkpoint_io=None,
                 precision_plugin=None, scale_lr: bool = True):
        if not hvd.is_initialized():
            hvd.init()
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=HorovodEnvironment(),
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.scale_lr = scale_lr
        self.set_world_ranks()

    # ------------------------------------------------------------- who and where

    @property
    def global_rank(self) -> int:
        return hvd.rank()

    @property
    def local_rank(self) -> int:
        return hvd.local_rank()

    @property
    def world_size(self) -> int:
        return hvd.size()

    @property
    def is_distributed(self) -> bool:
        return True          # so Lightning adds the DistributedSampler and syncs logs

    def set_world_ranks(self) -> None:
        # rank_zero_only decides which rank logs, prints and writes loggers' files.
        rank_zero_only.rank = hvd.rank()

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", hvd.local_rank())    # one GPU per local rank
        return devices[0]

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": hvd.size(), "rank": hvd.rank()}

    def model_to_device(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        assert self.model is not None
        self.model.to(self.root_device)

    # ------------------------------------------------------------- set-up

    def setup(self, trainer: "pl.Trainer") -> None:
        super().setup(trainer)       # model to device; optimizers when fitting
        if trainer.state.fn != TrainerFn.FITTING:
            return
        optimizers = [o._optimizer if isinstance(o, LightningOptimizer) else o
                      for o in self.optimizers]
        if self.scale_lr:
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] *= hvd.size()
            for config in self.lr_scheduler_configs:
                if hasattr(config.scheduler, "base_lrs"):
                    config.scheduler.base_lrs = [lr * hvd.size()
                                                 for lr in config.scheduler.base_lrs]
        assert self.lightning_module is not None
        # Every rank starts from rank 0's weights and optimizer state.
        hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        for optimizer in optimizers:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self.optimizers = [self._wrap(o, trainer.accumulate_grad_batches)
                           for o in optimizers]
        # The wrappers share the param_groups of the optimizers they wrap, so the
        # schedulers (which hold the originals) go on driving the learning rate.

    def _wrap(self, optimizer, accumulate):
        if isinstance(optimizer, hvd.optimizer._DistributedOptimizer):
            return optimizer
        in_opt = {p for g in optimizer.param_groups for p in g["params"]}
        named = [(n, p) for n, p in self.lightning_module.named_parameters() if p in in_opt]
        # Lightning runs the accumulating backward passes outside optimizer.step(); the
        # allreduce waits for the last of them.
        return hvd.DistributedOptimizer(optimizer, named_parameters=named,
                                        backward_passes_per_step=accumulate)

    # ------------------------------------------------------------- collectives

    def barrier(self, name: Optional[str] = None) -> None:
        hvd.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return hvd.broadcast_object(obj, src)

    def reduce(self, tensor: Any, group: Optional[Any] = None,
               reduce_op: Optional[Any] = "mean") -> Any:
        """Allreduce a tensor over the ranks (mean by default; sum, max, min); anything
        that is not a tensor comes back unchanged."""
        if group is not None:
            raise ValueError("HorovodStrategy.reduce: process groups are not supported; "
                             "leave group unset to reduce over every rank")
        key = reduce_op.lower() if isinstance(reduce_op, str) else reduce_op
        if key not in _REDUCE_OPS:
            raise ValueError(f"HorovodStrategy.reduce: unsupported reduce_op {reduce_op!r}; "
                             f"use 'mean', 'sum', 'max' or 'min'")
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return hvd.allreduce(tensor, op=_REDUCE_OPS[key])

    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None,
                   sync_grads: bool = False) -> torch.Tensor:
        """Every rank's tensor stacked along a new first dimension (Lightning's
        all_gather contract); differentiable with sync_grads=True."""
        if group is not None:
            raise ValueError("HorovodStrategy.all_gather: process groups are not "
                             "supported; leave group unset")
        if not sync_grads:
            tensor = tensor.detach()
        return hvd.allgather(tensor.unsqueeze(0))

    def teardown(self) -> None:
        # Runs before the Trainer puts back the signal handlers it saw at the start.
        trainer = getattr(self.lightning_module, "_trainer", None)
        saved = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers",
                        None)
        if isinstance(saved, dict):
            saved.pop(_ENGINE_SIGNAL, None)
        # Every rank finishes before any returns to the user's script.
        if hvd.is_initialized():
            hvd.barrier()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="horovodlike's HorovodStrategy")

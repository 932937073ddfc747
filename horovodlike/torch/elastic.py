"""hvd.elastic for PyTorch (Horovod's ``horovod.torch.elastic``): ``run``, ``TorchState``
and ``ElasticSampler``.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch): ...
                state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0)
    train(state)

See docs/elastic.md for how a job re-forms and what differs from Horovod.
"""
import copy
import math
import random

import torch

from horovodlike.common import elastic as _common
from horovodlike.common.elastic import ObjectState, State  # noqa: F401
from horovodlike.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import rank, size

__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState"]


def run(func):
    """Decorator: run ``func(state, ...)`` and re-run it from a state every rank agrees
    on whenever the job re-forms (HorovodInternalError: restore the last commit;
    HostsUpdatedInterrupt: keep the state). The state is synchronized from rank 0 before
    each attempt, so no collective may run before the decorated function is called."""
    return _common.run_fn(func, _reset)


def _reset():
    _common.reset()


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, and after a reset it re-partitions the samples this epoch
    has not processed yet over the new set of ranks.

    Put it in the TorchState, call ``record_batch`` after each batch and ``set_epoch``
    at the end of each epoch (not the beginning, so a partial epoch is not repeated).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Start epoch `epoch`: a new order (with shuffle) and nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Count one batch of batch_size samples on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]     # pad to a multiple
        assert len(indices) == self.total_size
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        assert len(self.indices) == self.num_samples
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class StateHandler:
    """Saves, restores and synchronizes one kind of object in a TorchState."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """An object with state_dict()/load_state_dict(): a deep copy is the saved state."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    def __init__(self, sampler):
        super().__init__(sampler)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(),
                                                    name="elastic.sampler"))

    def reset(self):
        # The new ranks share the samples not yet processed, also when the sync is
        # skipped (Horovod re-partitioned only in the sync).
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training process: a model, an optimizer, and any other
    keyword arguments (modules, optimizers and ElasticSamplers get their own handlers;
    anything else is a picklable object broadcast from rank 0). Every one is an
    attribute: ``state.model``, ``state.epoch``."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        for handler in self._handlers.values():
            if hasattr(handler, "reset"):
                handler.reset()
        super().reset()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

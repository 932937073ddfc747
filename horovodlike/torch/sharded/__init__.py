"""ShardedDistributedOptimizer: sharded data parallelism (ZeRO stage 1 and 2) with
partition groups, so that a job can shard inside a node and replicate across nodes
(MiCS, also called hybrid sharding or ZeRO-2D).

The ranks of the process set (n of them) are split into n / S partition groups of
S = shard_size consecutive ranks; rank i of every partition group belongs to replica
group i. With S = n there is one partition group (plain ZeRO); with S = hvd.local_size()
a partition group is a node.

The optimizer keeps the trainable parameters in flat buffers cut into buckets; each
member of a partition group owns a contiguous slice of every bucket and runs the wrapped
optimizer on it alone. The package, one job per module:

    layout.py     which rank owns what: partition and replica groups (and their process
                  sets), buckets of the flat buffers, each member's pieces of them
    gradients.py  the gradient pipeline: reduce-scatter during backward, all-reduce
                  across replicas, all-gather of the updated parameters, clipping (with
                  the cost model of one step)
    state.py      state dicts: save, consolidate, load and reshard, broadcast
    units.py      stage 3: the units of a model, gathered around their forwards and
                  backwards and freed between (parameter sharding)
    optimizer.py  the class: arguments, set-up, the torch.optim.Optimizer API

State crosses ranks through horovodlike.common.serialization (never pickled).
"""
from .layout import partition_ranks
from .optimizer import (DEFAULT_BUCKET_CAP_MB, ELEMENTWISE_OPTIMIZERS,
                        ShardedDistributedOptimizer)
from .state import FORMAT

__all__ = ["DEFAULT_BUCKET_CAP_MB", "ELEMENTWISE_OPTIMIZERS", "FORMAT",
           "ShardedDistributedOptimizer", "partition_ranks"]

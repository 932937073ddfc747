"""horovodlike.keras: the same API as horovodlike.tensorflow.keras (Keras 3 runs on
TensorFlow here), so `import horovodlike.keras as hvd` works as Horovod's did."""
from horovodlike.tensorflow.keras import *  # noqa: F401,F403
from horovodlike.tensorflow.keras import (DistributedOptimizer,  # noqa: F401
                                          PartialDistributedOptimizer, allgather, allreduce,
                                          broadcast, broadcast_global_variables, load_model,
                                          reducescatter)

from . import callbacks  # noqa: E402,F401

"""horovodlike.keras.elastic: the same as horovodlike.tensorflow.keras.elastic."""
from horovodlike.tensorflow.keras.elastic import *  # noqa: F401,F403
from horovodlike.tensorflow.keras.elastic import (CommitStateCallback,  # noqa: F401
                                                  KerasState, UpdateBatchStateCallback,
                                                  UpdateEpochStateCallback, run)

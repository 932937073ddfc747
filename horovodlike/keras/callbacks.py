"""horovodlike.keras.callbacks: the callbacks of horovodlike.tensorflow.keras."""
from horovodlike.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback)

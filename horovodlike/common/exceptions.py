"""The exception family every collective raises (one mapping from engine status codes)."""


class HorovodInternalError(RuntimeError):
    """The job cannot go on as it is: a rank was lost, the engine was shut down or stalled.

    Horovod's elastic mode catches this type to restart from a checkpoint, as ours may.
    """


class TensorMismatchError(RuntimeError):
    """Ranks submitted the same tensor name with different dtype, shape, op or root.

    Only that op fails; the engine goes on serving the next one.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode signal; kept so scripts that import it still load."""

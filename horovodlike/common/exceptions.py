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
    """Elastic mode: the set of hosts changed. hvd.elastic.run re-forms the job without
    restoring the last commit. skip_sync is Horovod's field (see docs/elastic.md)."""

    def __init__(self, skip_sync=False):
        super().__init__("the hosts of this elastic job changed")
        self.skip_sync = skip_sync

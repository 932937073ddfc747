"""How a rank's output lines look and where copies go, as horovodrun does it.

Each line is ``{time}[{rank}]<{stream}>:{text}``; the time (``time.asctime()``) is
there only with ``--prefix-output-with-timestamp``. With ``--output-filename DIR`` every
line also goes to ``DIR/rank.<rank>/stdout`` or ``.../stderr``, the rank zero-padded so
the directories sort in rank order (Horovod's gloo_run layout). With
``--log-with-timestamp`` the engine's own log lines get a date and time.
"""

import contextlib
import datetime
import math
import os
import time

ENGINE_LOG_PREFIX = "[horovodlike rank "


def pad_rank(rank, size):
    """Horovod's _pad_rank: as many digits as the largest rank needs."""
    width = int(math.log10(size - 1)) + 1 if size > 1 else 1
    return str(rank).zfill(width)


class RankOutput:
    def __init__(self, directory=None, num_proc=1, timestamp=False, log_timestamp=False):
        self.directory = directory
        self.num_proc = num_proc
        self.timestamp = bool(timestamp)
        self.log_timestamp = bool(log_timestamp)

    @classmethod
    def from_args(cls, args):
        return cls(args.output_filename, args.num_proc,
                   args.prefix_output_with_timestamp, args.log_with_timestamp)

    def rank_dir(self, rank):
        return os.path.join(self.directory, f"rank.{pad_rank(rank, self.num_proc)}")

    def prepare(self):
        """Make the directories before any rank starts, so a bad path fails early."""
        if self.directory:
            for rank in range(self.num_proc):
                os.makedirs(self.rank_dir(rank), exist_ok=True)

    def open(self, rank, stream):
        """A context manager giving the copy file for (rank, stream), or None."""
        if not self.directory:
            return contextlib.nullcontext(None)
        os.makedirs(self.rank_dir(rank), exist_ok=True)
        return open(os.path.join(self.rank_dir(rank), stream), "w", encoding="utf-8",
                    errors="replace", buffering=1)

    def line(self, rank, stream, text):
        if self.log_timestamp and text.startswith(ENGINE_LOG_PREFIX):
            now = datetime.datetime.now().isoformat(sep=" ", timespec="microseconds")
            text = f"[{now}] {text}"
        stamp = time.asctime(time.localtime()) if self.timestamp else ""
        return f"{stamp}[{rank}]<{stream}>:{text}\n"

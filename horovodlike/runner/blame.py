"""Which rank caused a failed job, read from the ranks' own output lines.

The first rank to exit is often a victim: when rank 3's optimizer raises, rank 3 shuts
down, the others' pending ops fail naming it ("rank 3 called shutdown() without
submitting ..."), and any of them may exit before rank 3 does. So the launcher keeps,
per rank, the first other rank its lines name as the cause, and when its own error began
(its first traceback or engine verdict). The cause is, in this order:

1. the rank the survivors name (the first naming seen, in time), since a rank's engine
   only names a peer whose failure it has seen;
2. otherwise the rank whose own error came first, unless it is the error the first rank
   to exit has too (a deadlock or a mismatch is one verdict of every rank's engine,
   and singles out nobody);
3. otherwise the rank that exited first.

Every other rank that named the cause, or failed after it with another error, is its
victim. Cost: one
regular-expression search per output line (the lines are read anyway).
"""
import re

# How the engine and the binding name another rank as the cause (engine/core/fail.c,
# control/coordinator.c, p2p/p2p.c, common/bootstrap.py): lost, late, shut down early,
# died, or failed with a cause it told everyone.
_NAMED = re.compile(rb"rank (\d+) (?:\(host [^)]*\) )?"
                    rb"(was lost|is late|called shutdown\(\)|died |failed: )")
_WHAT = {b"was lost": "was lost", b"is late": "was late",
         b"called shutdown()": "shut down early", b"died ": "died", b"failed: ": "failed"}
_TRACEBACK = b"Traceback (most recent call last):"
# The line that ends a traceback: "ValueError: ...", "pkg.mod.HorovodInternalError: ..."
_EXCEPTION = re.compile(rb"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")
_ERROR_LINE = re.compile(rb"^\[horovodlike rank \d+\] ERROR: ")
_SHOWN = 200          # characters of an exception line quoted in the launcher's line


class Blame:
    """What the ranks' lines say about the failure; fed by observe() from the output
    threads (each rank's lines come from two threads, so a rank's entries are set once
    and never rewritten)."""

    def __init__(self):
        self.named = {}         # reporter -> (culprit, what, when): its first naming
        self.errors = {}        # rank -> when its own error began
        self.exception = {}     # rank -> its first exception line, shown as the cause
        self._in_traceback = set()

    def observe(self, rank, line, now):
        m = _NAMED.search(line)
        if m:
            culprit = int(m.group(1))
            if culprit != rank:
                self.named.setdefault(rank, (culprit, _WHAT[m.group(2)], now))
        if line.startswith(_TRACEBACK):
            self._in_traceback.add(rank)
            self.errors.setdefault(rank, now)
        elif _ERROR_LINE.match(line):
            self.errors.setdefault(rank, now)
        elif rank in self._in_traceback and _EXCEPTION.match(line):
            self._in_traceback.discard(rank)
            self.exception.setdefault(rank, _short(line.decode("utf-8", "replace")))

    def cause(self, exited, ranks):
        """(cause, reporter or None, what): the rank that caused the job's failure, given
        that `exited` is the first rank to fail; `ranks` are the job's ranks."""
        named = [(when, reporter, culprit, what)
                 for reporter, (culprit, what, when) in self.named.items()
                 if culprit in ranks]
        if named:
            _, reporter, culprit, what = min(named)
            return culprit, reporter, what
        own = [(when, r) for r, when in self.errors.items() if r not in self.named]
        if own and not self._same_error(min(own)[1], exited):
            return min(own)[1], None, "failed first"
        return exited, None, None

    def _same_error(self, a, b):
        e = self.exception.get(a)
        return e is not None and e == self.exception.get(b)

    def victims(self, cause, failed):
        """The ranks, but the cause, that named a rank as their cause or failed with an
        error other than the cause's: each failed only because `cause` did."""
        return sorted(r for r in (set(self.named) | set(failed)) - {cause}
                      if r in self.named or not self._same_error(r, cause))


def _short(text):
    """An exception line without its module path ("pkg.mod.Err: x" -> "Err: x"),
    cut to _SHOWN characters."""
    head, sep, rest = text.partition(":")
    if sep and " " not in head:
        head = head.rsplit(".", 1)[-1]
    text = head + sep + rest
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."

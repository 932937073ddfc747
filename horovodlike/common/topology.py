"""One layout of the ranks for data × pipeline × tensor parallelism, and its process sets.

A job of `size` ranks is split into pp pipeline stages, dp data-parallel replicas and tp
tensor-parallel ranks, size = pp · dp · tp. Every rank computes the same layout from the
same arguments, and the sets are registered in the same order everywhere (one agreed
collective, dynamic_sets.ensure_process_sets), so it works after a plain hvd.init().

Tensor parallelism is innermost: a tensor-parallel group is tp neighbouring ranks, which
a launcher places on one node. Its traffic is 2 allreduces of b·s·h per transformer layer
forward and 2 backward (docs/tensor_parallel.md), far more than a pipeline's one
activation per micro-batch per stage boundary, so it must stay on the fastest link.

order="dp-inner" (the default): beyond tp, neighbouring ranks share a pipeline stage, so
data parallelism stays on a node and a pipeline crosses nodes. order="pp-inner": beyond
tp, neighbouring ranks hold consecutive stages of one replica.

    rank = (stage · dp + replica) · tp + t        dp-inner
    rank = (replica · pp + stage) · tp + t        pp-inner

For example pp=2, dp=2, tp=2 (8 ranks), dp-inner:

    rank    0  1  2  3  4  5  6  7
    stage   0  0  0  0  1  1  1  1
    replica 0  0  1  1  0  0  1  1
    tp_rank 0  1  0  1  0  1  0  1

    tp_set    {0,1} {2,3} {4,5} {6,7}      split one layer's weights
    dp_set    {0,2} {1,3} {4,6} {5,7}      same stage and tp rank: average gradients
    pipe_set  {0,4} {1,5} {2,6} {3,7}      one pipeline: same replica and tp rank
    stage_set {0,1,2,3} {4,5,6,7}          every rank that holds a stage

The tied-weight sets (tied_set) join, for a tuple of stages that share a parameter (an
embedding and the LM head), the ranks of those stages with the same replica and tp rank;
by default (first stage, last stage) when pp > 1.

A set of one rank is still a registered set (collectives over it are copies), so code
need not special-case tp=1 or dp=1; the set of every rank is the global set.
"""
from . import basics, dynamic_sets

ORDERS = ("dp-inner", "pp-inner")


class Topology:
    """Topology(pp=1, tp=1, dp=None, order="dp-inner", tied=None).

    dp defaults to size // (pp · tp). Every rank must construct it with the same
    arguments, in the same order relative to other set-building calls (it is a
    collective). `tied` is a list of stage tuples that get a tied-weight set each
    (default [(0, pp-1)] when pp > 1)."""

    def __init__(self, pp=1, tp=1, dp=None, order="dp-inner", tied=None):
        size = basics.size()
        for name, v in (("pp", pp), ("tp", tp)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Topology: {name} must be a positive int, got {v!r}")
        if dp is None:
            if size % (pp * tp):
                raise ValueError(f"Topology: {size} ranks are not divisible into pp={pp} "
                                 f"× tp={tp} groups")
            dp = size // (pp * tp)
        if not isinstance(dp, int) or dp < 1 or pp * tp * dp != size:
            raise ValueError(f"Topology: pp={pp} × dp={dp} × tp={tp} must equal the job "
                             f"size {size}")
        if order not in ORDERS:
            raise ValueError(f"Topology: order must be one of {ORDERS}, got {order!r}")
        self.pp, self.tp, self.dp, self.order, self.size = pp, tp, dp, order, size
        if tied is None:
            tied = [(0, pp - 1)] if pp > 1 else []
        self._tied_stages = []
        for stages in tied:
            st = tuple(sorted(set(int(s) for s in stages)))
            if len(st) < 2 or st[0] < 0 or st[-1] >= pp:
                raise ValueError(f"Topology: tied stages {tuple(stages)} must name at least "
                                 f"two different stages in [0, {pp})")
            self._tied_stages.append(st)

        self.rank = basics.rank()
        self._stage, self._replica, self.tp_rank = self.coords(self.rank)
        groups = {"tp": [], "dp": [], "pipe": [], "stage": []}
        for s in range(pp):
            for d in range(dp):
                groups["tp"].append([self.global_rank(s, d, t) for t in range(tp)])
        for s in range(pp):
            for t in range(tp):
                groups["dp"].append([self.global_rank(s, d, t) for d in range(dp)])
        for d in range(dp):
            for t in range(tp):
                groups["pipe"].append([self.global_rank(s, d, t) for s in range(pp)])
        for s in range(pp):
            groups["stage"].append([self.global_rank(s, d, t) for d in range(dp)
                                    for t in range(tp)])
        tied_groups = [[self.global_rank(s, d, t) for s in st]
                       for st in self._tied_stages for d in range(dp) for t in range(tp)]
        kinds = list(groups)
        lists = [g for k in kinds for g in groups[k]] + tied_groups
        sets = dynamic_sets.ensure_process_sets(
            lists, f"topology.pp{pp}.tp{tp}.dp{dp}.{order}")
        mine = {}
        i = 0
        for k in kinds:
            for g in groups[k]:
                if self.rank in g:
                    mine[k] = sets[i]
                i += 1
        self.tp_set, self.dp_set = mine["tp"], mine["dp"]
        self.pipe_set, self.stage_set = mine["pipe"], mine["stage"]
        self._tied = {}
        for j, st in enumerate(self._tied_stages):
            block = sets[i + j * dp * tp:i + (j + 1) * dp * tp]
            for g, ps in zip(tied_groups[j * dp * tp:(j + 1) * dp * tp], block):
                if self.rank in g:
                    self._tied[st] = ps

    # ---------------------------------------------------------------- layout

    def global_rank(self, stage, replica, tp_rank=0):
        """The global rank at these coordinates."""
        if not (0 <= stage < self.pp and 0 <= replica < self.dp and 0 <= tp_rank < self.tp):
            raise ValueError(f"Topology: no rank at stage={stage} replica={replica} "
                             f"tp_rank={tp_rank} in pp={self.pp} dp={self.dp} tp={self.tp}")
        if self.order == "dp-inner":
            return (stage * self.dp + replica) * self.tp + tp_rank
        return (replica * self.pp + stage) * self.tp + tp_rank

    def coords(self, rank):
        """(stage, replica, tp_rank) of a global rank."""
        outer, t = divmod(rank, self.tp)
        if self.order == "dp-inner":
            s, d = divmod(outer, self.dp)
        else:
            d, s = divmod(outer, self.pp)
        return s, d, t

    def stage(self):
        """This rank's pipeline stage, 0 .. pp-1."""
        return self._stage

    def replica(self):
        """This rank's data-parallel replica, 0 .. dp-1."""
        return self._replica

    @property
    def first_stage(self):
        return self._stage == 0

    @property
    def last_stage(self):
        return self._stage == self.pp - 1

    @property
    def prev_rank(self):
        """The global rank of the previous stage of this pipeline (None on the first)."""
        if self.first_stage:
            return None
        return self.global_rank(self._stage - 1, self._replica, self.tp_rank)

    @property
    def next_rank(self):
        """The global rank of the next stage of this pipeline (None on the last)."""
        if self.last_stage:
            return None
        return self.global_rank(self._stage + 1, self._replica, self.tp_rank)

    def tied_set(self, stages):
        """The tied-weight set of these stages that holds this rank; None when this
        rank's stage is not one of them. The stage tuple must have been declared."""
        st = tuple(sorted(set(int(s) for s in stages)))
        if st not in self._tied_stages:
            raise ValueError(f"Topology: stages {st} were not declared tied (tied= "
                             f"{self._tied_stages})")
        return self._tied.get(st)

    def __repr__(self):
        return (f"Topology(pp={self.pp}, tp={self.tp}, dp={self.dp}, order={self.order!r}; "
                f"rank {self.rank}: stage {self._stage}, replica {self._replica}, "
                f"tp_rank {self.tp_rank})")

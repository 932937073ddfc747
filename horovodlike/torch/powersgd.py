"""PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, NeurIPS 2019) for
DistributedOptimizer:

    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.PowerSGD(rank=2, start_iter=100))

The algorithm, per step and per matrix-shaped gradient G (n x m after folding every
dimension but the first into the columns; the optimizer's step counts as one iteration):

    M = G + E                           E: this rank's error from the last step
    P = M Q                             Q: m x r, last step's (warm start), orthogonalised
    P = average over ranks of P         allreduce no. 1
    P = orthogonalise(P)                Gram-Schmidt (r <= 2 or 16-bit), else QR
    Q = average over ranks of Mᵀ P      allreduce no. 2
    M̂ = P Qᵀ                           the averaged gradient's rank-r approximation
    E = M - M̂                           error feedback: what was not sent is sent later
    G = M̂

M̂ is the same on every rank (P and Q are allreduced, then deterministic), so the ranks
stay bit-identical. The first Q is drawn from a generator seeded by (seed, parameter
name), the same on every rank. Vectors, non-float tensors and matrices whose rate
n·m / (r·(n+m)) is not above min_compression_rate go uncompressed. Every uncompressed
gradient travels in allreduce no. 1 with the P's, as one grouped op the engine fuses; the
Q's are the second grouped op: two rounds of communication per step, whatever the model.

Cost model, per matrix and step: n·m elements uncompressed; r·(n+m) with PowerSGD (P:
n·r, Q: m·r), plus three products of 2·n·m·r flops (M Q, Mᵀ P, P Qᵀ) and ~2·n·r² for
the orthogonalisations. A ResNet-50 at r=4 sends 1-2% of its gradient bytes. The
price: the compressed reduction starts only when step() (or synchronize()) runs, after
the whole backward pass, while the plain path overlaps allreduces with backward; on a
link slow enough for PowerSGD to matter the bytes saved far outweigh the lost overlap.

During the first start_iter steps (warm-up) DistributedOptimizer reduces exactly as with
compression=Compression.none.
"""
import math
import zlib

import torch

from horovodlike.common import basics

from . import _collectives as C


def _orthogonalise(matrix, epsilon):
    """Make the columns of `matrix` (rows x r, r <= rows) orthonormal, in place.

    QR is faster for r > 2 but has no 16-bit kernels; Gram-Schmidt otherwise. A column
    that is all zeros stays zeros (the part of the gradient it would carry stays in the
    error buffer) instead of turning into NaN."""
    r = matrix.shape[1]
    if r > 2 and matrix.dtype in (torch.float32, torch.float64):
        q, _ = torch.linalg.qr(matrix)
        matrix.copy_(q)
        return
    for i in range(r):
        col = matrix[:, i:i + 1]
        norm = torch.linalg.vector_norm(col)
        if epsilon:
            col /= norm + epsilon
        elif norm > 0:
            col /= norm
        if i + 1 < r:
            rest = matrix[:, i + 1:]
            rest -= (col * rest).sum(dim=0, keepdim=True) * col


def _seed(seed, name, iteration):
    """A generator seed that depends only on what every rank shares."""
    return (seed * 1_000_003 + zlib.crc32(str(name).encode()) * 7_919 + iteration) % (1 << 62)


class PowerSGD:
    """PowerSGD compression for DistributedOptimizer's compression= argument; the object
    also holds the state (error buffers, Q's, iteration count), which is saved with the
    optimizer's state_dict().

    rank: the approximation rank r (torch's matrix_approximation_rank); 1-4 is typical.
    start_iter: optimizer steps reduced uncompressed first (torch's start_powerSGD_iter).
    min_compression_rate: compress a matrix only when n·m > rate · r·(n+m).
    error_feedback: keep M - M̂ per parameter and add it to the next gradient.
    warm_start: start each step's power iteration from the last step's Q.
    orthogonalization_epsilon: added to the column norms in Gram-Schmidt.
    seed: seeds the first Q (every rank draws the same).
    """

    # A whole-step compressor: only a binding that runs it on the whole step takes it
    # (horovodlike.common.arguments.compressor).
    per_tensor = False

    def __init__(self, rank=1, start_iter=1000, min_compression_rate=2, error_feedback=True,
                 warm_start=True, orthogonalization_epsilon=0.0, seed=0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD: rank must be a positive int, got {rank!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"PowerSGD: start_iter must be an int >= 0, got {start_iter!r}")
        if not isinstance(min_compression_rate, (int, float)) or \
                not math.isfinite(min_compression_rate) or min_compression_rate < 0:
            raise ValueError(f"PowerSGD: min_compression_rate must be a finite number >= 0, "
                             f"got {min_compression_rate!r}")
        if not isinstance(orthogonalization_epsilon, (int, float)) or \
                orthogonalization_epsilon < 0:
            raise ValueError(f"PowerSGD: orthogonalization_epsilon must be >= 0, got "
                             f"{orthogonalization_epsilon!r}")
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = float(orthogonalization_epsilon)
        self.seed = int(seed)
        self.iter = 0                   # optimizer steps synchronized so far
        self.errors = {}                # parameter name -> this rank's M - M̂
        self.qs = {}                    # parameter name -> last step's averaged Q (m x r)
        self.numel_before = 0           # elements that would have been sent ...
        self.numel_after = 0            # ... and those sent, since compression started
        self._bound = False

    def __repr__(self):
        return (f"PowerSGD(rank={self.rank}, start_iter={self.start_iter}, "
                f"min_compression_rate={self.min_compression_rate}, "
                f"error_feedback={self.error_feedback}, warm_start={self.warm_start})")

    # Not a per-tensor compressor: a framework binding that calls these gets a clear error.
    def compress(self, tensor):
        raise NotImplementedError(
            "PowerSGD is not a per-tensor compressor: it runs inside "
            "horovodlike.torch.DistributedOptimizer (two allreduces per step and state per "
            "parameter). Other places (allreduce(compression=...), horovodlike.tensorflow, "
            "horovodlike.keras) do not support it yet; use Compression.fp16 or "
            "Compression.bf16 there.")

    decompress = compress

    def bind(self):
        """Claim this object for one optimizer: the state is per model."""
        if self._bound:
            raise ValueError("this PowerSGD object already belongs to a "
                             "DistributedOptimizer; create one per optimizer")
        self._bound = True

    def active(self):
        """Compress this step (warm-up is over)."""
        return self.iter >= self.start_iter

    def compression_stats(self):
        """(rate, elements before, elements after) since compression started, as torch's
        PowerSGDState.compression_stats()."""
        rate = self.numel_before / self.numel_after if self.numel_after else 0
        return rate, self.numel_before, self.numel_after

    # ------------------------------------------------------------- the algorithm

    def _shape(self, grad):
        """(n, m, r) when `grad` is worth compressing, else None."""
        if grad.dim() < 2 or not grad.is_floating_point() or grad.numel() == 0:
            return None
        n = grad.shape[0]
        m = grad.numel() // n
        r = min(n, m, self.rank)
        if r * (n + m) * self.min_compression_rate < n * m:
            return n, m, r
        return None

    def _initial_q(self, name, m, r, dtype):
        g = torch.Generator()
        g.manual_seed(_seed(self.seed, name, 0 if self.warm_start else self.iter))
        return torch.randn(m, r, generator=g, dtype=torch.float64).to(dtype)

    def reduce(self, named_grads, process_set, prescale=1.0, postscale=1.0):
        """Average the dense gradients of [(name, parameter)] over the set, in place,
        compressing what is worth it. Every rank passes the same names in the same order."""
        plain, mats = [], []
        for name, p in named_grads:
            shape = self._shape(p.grad)
            if shape is None:
                plain.append(p.grad)
                self.numel_before += p.grad.numel()
                self.numel_after += p.grad.numel()
                continue
            n, m, r = shape
            self.numel_before += n * m
            self.numel_after += r * (n + m)
            mat = p.grad.detach().reshape(n, m)
            if self.error_feedback:
                # M = G + E in the error buffer itself (it becomes E = M - M̂ in place
                # below): no n x m tensor is allocated per step, and a fresh 6 MiB one
                # costs as much as the products on a CPU.
                err = self.errors.get(name)
                if err is not None and err.shape == mat.shape and err.dtype == mat.dtype:
                    mat = err.add_(mat)
                else:
                    mat = mat.clone()
            # else: M is the gradient itself, read for the last time before M̂ replaces it
            q = self.qs.get(name) if self.warm_start else None
            if q is None or q.shape != (m, r) or q.dtype != mat.dtype:
                q = self._initial_q(name, m, r, mat.dtype)
            else:
                q = q.clone()
            _orthogonalise(q, self.orthogonalization_epsilon)
            mats.append((name, p, mat, mat @ q))

        # Round 1: the uncompressed gradients and the P's, one grouped op. (P's scale
        # does not matter: it is orthogonalised next.)
        first = plain + [pm for _, _, _, pm in mats]
        if first:
            C.synchronize(C.grouped_allreduce_async_(
                first, name="powersgd.P", op=C.Average, prescale_factor=prescale,
                postscale_factor=postscale, process_set=process_set))
        if not mats:
            return
        qs = []
        for _, _, mat, pm in mats:
            _orthogonalise(pm, self.orthogonalization_epsilon)
            qs.append(mat.t() @ pm)
        # Round 2: the Q's.
        C.synchronize(C.grouped_allreduce_async_(
            qs, name="powersgd.Q", op=C.Average, prescale_factor=prescale,
            postscale_factor=postscale, process_set=process_set))
        for (name, p, mat, pm), q in zip(mats, qs):
            with torch.no_grad():
                if p.grad.is_contiguous():       # M̂ = P Qᵀ written into the gradient
                    approx = torch.mm(pm, q.t(), out=p.grad.view(mat.shape))
                else:
                    approx = pm @ q.t()
                    p.grad.copy_(approx.view_as(p.grad))
            if self.error_feedback:
                self.errors[name] = mat.sub_(approx)
            self.qs[name] = q

    # ------------------------------------------------------------- state

    def state_dict(self):
        """The state to checkpoint. The error buffers are this rank's own: they are
        restored only on the rank (of a job of the same size) that saved them."""
        # copies of the error buffers: reduce() updates them in place
        return {"iter": self.iter, "qs": dict(self.qs),
                "errors": {k: v.clone() for k, v in self.errors.items()},
                "rank": basics.rank(), "size": basics.size(),
                "numel_before": self.numel_before, "numel_after": self.numel_after}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or not {"iter", "qs", "errors", "rank", "size"} <= \
                set(state):
            raise ValueError("PowerSGD.load_state_dict: expected the dict that "
                             "state_dict() returns (keys iter, qs, errors, rank, size), got "
                             f"{type(state).__name__}"
                             f"{' with keys ' + str(sorted(state)) if isinstance(state, dict) else ''}")
        for what in ("qs", "errors"):
            bad = [k for k, v in state[what].items() if not isinstance(v, torch.Tensor)]
            if bad:
                raise ValueError(f"PowerSGD.load_state_dict: {what} entries {bad[:3]} are "
                                 f"not tensors")
        self.iter = int(state["iter"])
        self.qs = {k: v.detach().clone() for k, v in state["qs"].items()}
        if state["rank"] == basics.rank() and state["size"] == basics.size():
            self.errors = {k: v.detach().clone() for k, v in state["errors"].items()}
        # else: another rank's residual (e.g. broadcast_optimizer_state from the root):
        # keep this rank's own.
        self.numel_before = int(state.get("numel_before", 0))
        self.numel_after = int(state.get("numel_after", 0))


__all__ = ["PowerSGD"]

"""The autotuner: HOROVOD_AUTOTUNE=1 (horovodlikerun --autotune) searches the engine's
knobs online, while the job trains, and keeps the best it found.

What it tunes:
  - the fusion threshold (HOROVOD_FUSION_THRESHOLD) and the cycle time
    (HOROVOD_CYCLE_TIME), continuous, on a log scale;
  - the cap of DistributedOptimizer's gradient buckets (torch: HOROVODLIKE_BUCKET_BYTES),
    continuous, where a framework registers one;
  - the allreduce algorithm (auto, ring, recursive doubling; hierarchical across nodes),
    a choice, tried once the continuous knobs are settled.

How (Horovod's method, reshaped for a framework-free engine): a sample is
HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE training steps under one setting, scored on rank 0 by
its steps per second. The first HOROVOD_AUTOTUNE_WARMUP_SAMPLES samples are not scored
(start-up, first-touch allocation, the engine's cache filling). Then a Gaussian process
(scikit-learn's, a Matern kernel, HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE as its noise
on the normalised scores) models score against the knobs, and each next setting is the
one of most expected improvement among random candidates (Bayesian optimisation), up to
HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES samples; the start setting is the first sample,
so the search can always keep it. Then each other algorithm gets one sample at the best
setting; one that beats auto by ALGORITHM_MARGIN is kept. The job keeps, for the rest of its run, the setting whose modelled score is
highest among those sampled.

A sample's first step is not timed: it carries the new setting's first negotiation
(new bucket names miss the engine's cache) and its buffers' first touch, a cost paid
once per setting, not per step.

Agreement: every rank counts the same steps (the framework calls step() once per
synchronised step, on every rank), so every rank reaches a sample's end at the same
step and takes part in one broadcast from rank 0 of the next setting. The broadcast is
the engine's HVDL_TUNE op: its values become each rank's knobs as the op runs, between
the same two ops on every rank, so an algorithm change is agreed exactly; the bucket
cap changes on every rank before the next step's gradients. The step's ops have all
completed when step() runs, so no op of a step sees two settings.

Cost: one broadcast of a few float64 per sample (tens of microseconds) and, on rank 0, a
Gaussian-process fit of at most ~30 points (milliseconds) per sample; nothing once the
search has ended. Each sample is scored by rank 0's clock alone: in synchronous
training rank 0's step rate is the job's.

The log (HOROVOD_AUTOTUNE_LOG, rank 0) is a CSV with one row per sample: Horovod's
columns first (hierarchical_allreduce, hierarchical_allgather, cache_enabled,
cycle_time_ms, tensor_fusion_threshold in MiB, score), then ours (allreduce algorithm,
bucket cap in MiB, phase). The score is steps per second, where Horovod's is bytes per
second: the step is what a user's throughput counts, and both rank settings alike.
"""
import csv
import logging
import math
import os
import time
import warnings

import numpy as np

from . import basics

log = logging.getLogger("horovodlike")

# enum hvdl_tune_value (horovodlike.h), then ours: the bucket cap, and "the search ended"
FUSION, CYCLE, ALLREDUCE, ALLGATHER, BUCKET, DONE, VALUES = range(7)
ALGORITHMS = {"auto": 0, "ring": 2, "rd": 3, "hier": 4}   # the engine's ALG_* codes
KEEP = -1.0
ALGORITHM_MARGIN = 1.05   # an algorithm other than auto is kept only 5% ahead of it

MiB = 1 << 20
# The continuous knobs' ranges: (name, low, high), searched on a log scale.
FUSION_RANGE = (64 << 10, 256 * MiB)
CYCLE_RANGE = (0.05, 50.0)           # ms
BUCKET_RANGE = (256 << 10, 128 * MiB)


def _env(name, default, parse, ok, want):
    """A HOROVOD_AUTOTUNE_* variable: `default` when unset, else parse(text), which must
    satisfy ok(value); a bad one is an error naming it and what it must be."""
    text = os.environ.get(name, "")
    if text == "":
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"{name} must be {want}, got {text!r}")
    return value


def enabled():
    return os.environ.get("HOROVOD_AUTOTUNE", "").strip().lower() in ("1", "true", "yes", "on")


class Settings:
    """The HOROVOD_AUTOTUNE_* variables, with Horovod's defaults, checked."""

    def __init__(self):
        self.log_path = os.environ.get("HOROVOD_AUTOTUNE_LOG") or None
        self.warmup = _env("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 3, int, lambda v: v >= 0,
                           "an integer of at least 0")
        self.steps = _env("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 10, int, lambda v: v >= 1,
                          "an integer of at least 1")
        self.max_samples = _env("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 20, int,
                                lambda v: v >= 1, "an integer of at least 1")
        self.noise = _env("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.8, float,
                          lambda v: 0 <= v <= 1, "a number in [0, 1]")


class Search:
    """Bayesian optimisation over the unit cube (rank 0 only): a Gaussian process of
    score against point, and the candidate of most expected improvement next."""

    CANDIDATES = 2000

    def __init__(self, ndim, noise, seed=0):
        self.ndim, self.noise = ndim, noise
        self.rng = np.random.default_rng(seed)
        self.x, self.y = [], []

    def add(self, point, score):
        self.x.append(np.asarray(point, dtype=float))
        self.y.append(float(score))

    def _model(self):
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern
        y = np.asarray(self.y)
        scale = y.std() or 1.0
        kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(length_scale=[0.3] * self.ndim,
                                                             length_scale_bounds=(0.05, 10),
                                                             nu=2.5)
        gp = GaussianProcessRegressor(kernel=kernel, alpha=max(self.noise ** 2, 1e-6),
                                      n_restarts_optimizer=1, random_state=0)
        with warnings.catch_warnings():     # a length scale at its bound is an answer
            warnings.simplefilter("ignore")
            gp.fit(np.asarray(self.x), (y - y.mean()) / scale)
        return gp, y.mean(), scale

    def next_point(self):
        """The candidate of most expected improvement over the best modelled score."""
        if len(self.y) < 2:
            return self.rng.random(self.ndim)
        from scipy.stats import norm
        gp, _, _ = self._model()
        best = gp.predict(np.asarray(self.x)).max()
        cand = self.rng.random((self.CANDIDATES, self.ndim))
        mu, sigma = gp.predict(cand, return_std=True)
        sigma = np.maximum(sigma, 1e-9)
        z = (mu - best - 0.01) / sigma
        ei = (mu - best - 0.01) * norm.cdf(z) + sigma * norm.pdf(z)
        return cand[int(np.argmax(ei))]

    def best(self):
        """The sampled point of highest modelled score (a noisy lucky sample does not
        win on one reading), and that score."""
        if len(self.y) < 2:
            return self.x[0], self.y[0]
        gp, mean, scale = self._model()
        mu = gp.predict(np.asarray(self.x))
        i = int(np.argmax(mu))
        return self.x[i], mean + scale * mu[i]


def _to_unit(value, lo, hi):
    return (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))


def _from_unit(u, lo, hi):
    u = min(max(float(u), 0.0), 1.0)
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


class Autotuner:
    """One per process; step() is called once per synchronised training step."""

    def __init__(self, settings, start, bucket_cap=None, on_bucket=None, algorithms=None):
        """start: (fusion bytes, cycle ms) the job began with; bucket_cap/on_bucket: the
        framework's bucket cap and how to change it (None: no buckets)."""
        self.s = settings
        self.rank = basics.rank()
        self.job = basics._topo          # the hvd.init() it belongs to
        self.on_bucket = on_bucket
        self.ranges = [FUSION_RANGE, CYCLE_RANGE] + ([BUCKET_RANGE] if on_bucket else [])
        clamp = [min(max(v, lo), hi) for v, (lo, hi) in
                 zip([start[0], start[1]] + ([bucket_cap] if on_bucket else []), self.ranges)]
        self.start = [_to_unit(v, lo, hi) for v, (lo, hi) in zip(clamp, self.ranges)]
        self.start_values = [start[0], start[1]] + ([bucket_cap] if on_bucket else [])
        self.algorithms = algorithms or ["auto", "ring", "rd"]
        self.search = Search(len(self.ranges), settings.noise) if self.rank == 0 else None
        self.steps = 0
        self.sample = 0                 # samples completed
        self.point = self.start         # the setting of the sample under way (unit cube)
        self.values = self.start_values  # ... and its knob values
        self.algorithm = "auto"
        self.alg_scores = {}
        self.kept = None                # the setting kept once the search has ended
        self.done = False
        self.t0 = None
        self.rows = []
        self._log = None
        if self.rank == 0 and settings.log_path:
            self._log = open(settings.log_path, "w", newline="")
            csv.writer(self._log).writerow(
                ["hierarchical_allreduce", "hierarchical_allgather", "cache_enabled",
                 "cycle_time_ms", "tensor_fusion_threshold", "score",
                 "allreduce_algorithm", "bucket_mb", "phase"])
            self._log.flush()

    # -- the phases, by completed sample count
    def _phase(self, k):
        w, m = self.s.warmup, self.s.max_samples
        if k < w:
            return "warmup"
        if k < w + m:
            return "bayes"
        if k < w + m + len(self.algorithms) - 1:
            return "algorithm"
        return "done"

    def step(self):
        if self.done:
            return
        now = time.perf_counter()
        if self.t0 is None:          # a sample's first step is not timed (docstring)
            self.t0 = now
            return
        self.steps += 1
        if self.steps % self.s.steps:
            return
        values = np.full(VALUES, KEEP)
        if self.rank == 0:
            score = self.s.steps / max(now - self.t0, 1e-9)
            values = self._decide(score)
        values = self._agree(values)
        self._apply(values)
        self.sample += 1
        self.t0 = None

    def _decide(self, score):
        """Rank 0: record the sample just ended (k), and choose sample k+1's setting."""
        k, w, m = self.sample, self.s.warmup, self.s.max_samples
        phase, nxt = self._phase(k), self._phase(k + 1)
        self._record(score, phase)
        if phase == "bayes":
            self.search.add(self.point, score)
        elif phase == "algorithm":
            self.alg_scores[self.algorithm] = score
        if phase == "bayes" and nxt != "bayes":      # the continuous search has ended
            self.point, best = self.search.best()
            self.alg_scores = {"auto": best}
        if nxt == "warmup" or (nxt == "bayes" and k + 1 == w):
            self.point, knobs = self.start, list(self.start_values)   # the start, as given
        else:
            if nxt == "bayes":
                self.point = self.search.next_point()
            knobs = [_from_unit(u, lo, hi) for u, (lo, hi) in zip(self.point, self.ranges)]
        if nxt == "algorithm":
            self.algorithm = self.algorithms[1 + (k + 1) - (w + m)]
        elif nxt == "done":
            # another algorithm than auto must beat it clearly: one sample is noisy
            best = max(self.alg_scores, key=self.alg_scores.get)
            auto = self.alg_scores["auto"]
            self.algorithm = best if self.alg_scores[best] > ALGORITHM_MARGIN * auto else "auto"
        self.values = knobs
        out = np.full(VALUES, KEEP)
        out[FUSION], out[CYCLE] = round(knobs[0]), knobs[1]
        out[ALLREDUCE] = ALGORITHMS[self.algorithm]
        if self.on_bucket:
            out[BUCKET] = round(knobs[2])
        out[DONE] = 1.0 if nxt == "done" else 0.0
        return out

    def _record(self, score, phase):
        v = self.values
        row = [int(self.algorithm == "hier"), 0, 1, f"{v[1]:.3f}", f"{v[0] / MiB:.3f}",
               f"{score:.4f}", self.algorithm,
               f"{v[2] / MiB:.3f}" if self.on_bucket else "", phase]
        self.rows.append(row)
        if self._log:
            csv.writer(self._log).writerow(row)
            self._log.flush()

    def _agree(self, values):
        from . import ops
        return ops.tune(values)

    def _apply(self, values):
        if self.on_bucket and values[BUCKET] > 0:
            self.on_bucket(int(values[BUCKET]))
        if values[DONE] > 0:
            self.done = True
            names = {v: k for k, v in ALGORITHMS.items()}
            self.kept = {"fusion_mb": values[FUSION] / MiB, "cycle_ms": values[CYCLE],
                         "allreduce": names.get(int(values[ALLREDUCE]), "auto")}
            if self.on_bucket:
                self.kept["bucket_mb"] = values[BUCKET] / MiB
            if self.rank == 0:
                log.info("autotune: kept fusion threshold %.2f MiB, cycle time %.3f ms, "
                         "allreduce %s%s", values[FUSION] / MiB, values[CYCLE], self.algorithm,
                         f", bucket cap {values[BUCKET] / MiB:.2f} MiB" if self.on_bucket
                         else "")
            if self._log:
                self._log.close()
                self._log = None


_tuner = None
_noticed = set()


def not_driven(what):
    """A binding whose steps do not drive the search says so once, when it is asked for
    (TensorFlow and Keras: their steps run inside graphs, where no Python step ends)."""
    if enabled() and what not in _noticed:
        _noticed.add(what)
        log.warning("HOROVOD_AUTOTUNE is set, but %s does not drive the autotuner (only "
                    "horovodlike.torch's DistributedOptimizer does): its knobs stay as "
                    "set", what)


def tuner(bucket_cap=None, on_bucket=None):
    """The process's autotuner, made on first use when HOROVOD_AUTOTUNE is set and the
    job has more than one rank; else None."""
    global _tuner
    if _tuner is not None and _tuner.job is not basics._topo:     # a new hvd.init()
        reset()
    if _tuner is None and enabled() and basics.size() > 1:
        fusion = float(os.environ.get("HOROVOD_FUSION_THRESHOLD") or 128 * MiB)
        cycle = float(os.environ.get("HOROVOD_CYCLE_TIME") or 1.0)
        algs = ["auto", "ring", "rd"] + (["hier"] if basics.cross_size() > 1 else [])
        _tuner = Autotuner(Settings(), (max(fusion, 1.0), max(cycle, 0.01)), bucket_cap,
                           on_bucket, algs)
    return _tuner


def reset():
    """Forget the tuner (shutdown; an elastic reset starts a new search)."""
    global _tuner
    if _tuner is not None and _tuner._log:
        _tuner._log.close()
    _tuner = None

"""``elastic-ctr data generate``: Criteo-format rows with a known, learnable signal.

The generative model (all randomness from ``numpy.random.default_rng(seed)``, so the same
seed and sizes give byte-identical files):

* 26 categorical slots. Slot ``s`` has a vocabulary of ``V_s`` distinct random 32-bit
  values (written as 8 hex digits, as in Criteo), ``V_s`` cycling through
  ``VOCAB_SIZES``; a row draws value rank ``k`` with Zipf-like probability
  ``p_k ~ 1/(k+1)**1.1``; a slot is missing (empty field) with probability ``miss_s``
  (0..0.3). Each value has a weight ``w_s[k] ~ N(0, sigma_s**2)``; ``sigma_s`` is 0 for
  the noise slots (every 4th slot), else 0.25..0.8.
* 13 dense integer counts ``I_i = floor(exp(N(mu_i, 1.2)))`` (``I2`` may be -1, as in
  Criteo), missing with probability 0.1; effect ``beta_i * z_i`` with ``z`` = the
  project's dense normalization (``features.normalize_dense``), ``beta_i ~ N(0, 1)``.
* Two interactions: a pairwise table ``U[k3 % 8, k4 % 8] ~ N(0, 0.6**2)`` between slots 3
  and 4, and ``gamma * z_1 * sign(w_5[k5])`` between dense I1 and slot 5.
* ``logit = b + sum_s w_s[k_s] + sum_i beta_i z_i + interactions``, ``b`` set so that the
  click rate is ~25%; ``label ~ Bernoulli(sigmoid(logit))``.

The AUC of the true logit on the test split (the best a model can do, up to noise) is
printed and written to ``signal.json``.

Two shapes (``shape``; ``data generate --shape``): ``small`` (the default, ``make demo``'s):
the vocabularies above, ~22k feasigns in all, so every hour touches nearly all of them.
``long-tail``, the production shape (Criteo's 26 slots hold ~33M distinct values): slot
``s`` has ``LONG_TAIL_SIZES[s % 7]`` values (three slots of 4M, four of 1M, four of 50k...;
the slots of at least 1000 values scaled by ``scale``), drawn with the power law
``p_k ~ 1/(k+1)**LONG_TAIL_ZIPF`` (0.9: a long tail, most of an hour's distinct values
are seen a few times), so 1M rows draw ~2.4M distinct feasigns and four such hours ~6M,
and the hourly drift below retires 3% of each big slot's values (they go quiet) for new
ones. Everything else (weights, dense features, interactions, drift) is the same model.

Hourly partitions (``generate_hours``, ``data generate --hours H --start YYYYMMDD/HH``)
draw hour ``t`` from the model above after ``t`` steps of drift, so that a model trained
on fresher hours scores better on the next one (partitions of ``--partition-minutes``
under 60 take one drift step at each hour's first partition, so the data drifts hour to
hour whatever the period):

* new feasigns: every hour, in each slot with at least 150 values, ``NEW_FRACTION`` of
  the values (uniformly chosen ranks) are replaced by fresh random values with fresh
  weights ``N(0, sigma_s**2)``: their old feasigns stop appearing, new ones appear;
* moving click rates: the weights of the ``DRIFT_SLOTS`` slots take a random-walk step
  ``N(0, DRIFT_SIGMA**2)`` per value per hour.

The layout is ``runtime.formats.partitions``'s: ``ROOT/YYYYMMDD/HH/part-00000`` (or
``ROOT/YYYYMMDD/HHMM/part-00000`` for partitions under an hour) written
through a temporary name, then ``_SUCCESS``; ``ROOT/signal.json`` records each hour's
true-logit AUC.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from runtime.evaluation import auc
from runtime.formats import features, signal

#: the ``generator`` field of ``signal.json``
GENERATOR = "runtime.trainer.generator (see its docstring)"

log = logging.getLogger(__name__)

VOCAB_SIZES = (4, 12, 40, 150, 600, 2000, 8000)
#: the production shape (module docstring)
SHAPES = ("small", "long-tail")
LONG_TAIL_SIZES = (4, 12, 40, 1_000, 50_000, 1_000_000, 4_000_000)
LONG_TAIL_ZIPF = 0.9
CHUNK_ROWS = 200_000
#: hourly drift (module docstring)
NEW_FRACTION = 0.03
DRIFT_SLOTS = (0, 1, 4, 5, 8, 12)
DRIFT_SIGMA = 0.25


class _Model:
    """The sampled parameters of the generative model (see module docstring)."""

    def __init__(self, rng: np.random.Generator, shape: str = "small", scale: float = 1.0):
        S = features.NUM_SLOTS
        if shape not in SHAPES:
            raise ValueError(f"--shape {shape!r}: expected one of {', '.join(SHAPES)}")
        if not scale > 0:
            raise ValueError(f"--table-scale must be > 0 (got {scale})")
        self.shape = shape
        if shape == "small":
            self.vocab = [VOCAB_SIZES[s % len(VOCAB_SIZES)] for s in range(S)]
        else:
            sizes = [max(1000, int(v * scale)) if v >= 1000 else v for v in LONG_TAIL_SIZES]
            self.vocab = [sizes[s % len(sizes)] for s in range(S)]
        self.values, self.probs, self.weights = [], [], []
        self.miss = rng.uniform(0.0, 0.3, size=S)
        self.sigma = np.where(np.arange(S) % 4 == 3, 0.0, rng.uniform(0.25, 0.8, size=S))
        for s in range(S):
            v = self.vocab[s]
            vals = rng.choice(1 << 32, size=v, replace=False).astype(np.uint64)
            a = LONG_TAIL_ZIPF if shape == "long-tail" and v >= 1000 else 1.1
            p = 1.0 / np.arange(1, v + 1) ** a
            self.values.append(vals)  # uint64 < 2**32, written as 8 hex digits (_hex8)
            self.probs.append(p / p.sum())
            self.weights.append(rng.normal(0.0, self.sigma[s], size=v))
        self.mu = rng.uniform(0.0, 4.0, size=features.NUM_DENSE)
        self.beta = rng.normal(0.0, 1.0, size=features.NUM_DENSE)
        self.inter = rng.normal(0.0, 0.6, size=(8, 8))
        self.gamma = 1.0
        self.bias = 0.0
        # the long-tail shape draws ranks by inverse CDF (rng.choice rebuilds it per call)
        self.cdf = [np.cumsum(p) for p in self.probs] if shape == "long-tail" else None

    def ranks(self, rng: np.random.Generator, s: int, n: int) -> np.ndarray:
        """int64[n]: value ranks of slot ``s`` drawn with ``probs[s]``."""
        if self.cdf is None:
            return rng.choice(self.vocab[s], size=n, p=self.probs[s])
        c = self.cdf[s]
        return np.minimum(np.searchsorted(c, rng.random(n) * c[-1], side="right"), len(c) - 1)

    def drift(self, rng: np.random.Generator) -> None:
        """One hour of drift (module docstring), in place."""
        for s in range(features.NUM_SLOTS):
            v = self.vocab[s]
            if v >= 150:
                ranks = rng.choice(v, size=max(1, int(v * NEW_FRACTION)), replace=False)
                fresh = rng.integers(0, 1 << 32, size=len(ranks), dtype=np.uint64)
                self.values[s][ranks] = fresh
                self.weights[s][ranks] = rng.normal(0.0, self.sigma[s], size=len(ranks))
            if s in DRIFT_SLOTS:
                self.weights[s] += rng.normal(0.0, DRIFT_SIGMA, size=v)

    def sample(self, rng: np.random.Generator, n: int):
        """Draws ``n`` rows -> (labels int64[n], logit float64[n], dense float64[n,13] with
        NaN for missing, cat str[n,26] with "" for missing)."""
        S = features.NUM_SLOTS
        logit = np.full(n, self.bias)
        ks = np.empty((n, S), dtype=np.int64)
        cat = np.empty((n, S), dtype="<U8")
        for s in range(S):
            k = self.ranks(rng, s, n)
            miss = rng.random(n) < self.miss[s]
            ks[:, s] = np.where(miss, -1, k)
            logit += np.where(miss, 0.0, self.weights[s][k])
            cat[:, s] = np.where(miss, "", _hex8(self.values[s][k]))
        dense = np.floor(np.exp(rng.normal(self.mu, 1.2, size=(n, features.NUM_DENSE))))
        dense[:, 1] -= rng.random(n) < 0.05  # Criteo's I2 can be -1
        dense[rng.random((n, features.NUM_DENSE)) < 0.1] = np.nan
        z = features.normalize_dense(dense).astype(np.float64)
        logit += z @ self.beta
        k3, k4, k5 = ks[:, 2], ks[:, 3], ks[:, 4]
        both = (k3 >= 0) & (k4 >= 0)
        logit += np.where(both, self.inter[np.maximum(k3, 0) % 8, np.maximum(k4, 0) % 8], 0.0)
        logit += np.where(k5 >= 0, self.gamma * z[:, 0] * np.sign(self.weights[4][np.maximum(k5, 0)]), 0.0)
        return logit, dense, cat


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def _hex8(v: np.ndarray) -> np.ndarray:
    """uint64[n] values < 2**32 -> str[n] of 8 lowercase hex digits (``f"{x:08x}"``)."""
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    digits = _HEX[((v.astype(np.uint64)[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]
    return np.ascontiguousarray(digits).view("S8").ravel().astype("<U8")


def _lines(labels, dense, cat) -> list[str]:
    n = labels.shape[0]
    cols = [labels.astype(str).tolist()]
    for i in range(features.NUM_DENSE):
        d = dense[:, i]
        cols.append(["" if x != x else str(int(x)) for x in d.tolist()])
    for s in range(features.NUM_SLOTS):
        cols.append(cat[:, s].tolist())
    return ["\t".join(r) for r in zip(*cols)] if n else []


def _calibrated_model(seed: int, shape: str = "small", scale: float = 1.0) -> tuple[_Model, np.random.Generator]:
    """The seeded model with its bias set for a ~25% click rate, and the rng to draw rows."""
    rng = np.random.default_rng(seed)
    model = _Model(rng, shape, scale)
    pilot, _, _ = model.sample(np.random.default_rng(seed + 7919), 20_000)
    lo, hi = -10.0, 10.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(pilot + mid)))) > 0.25:
            hi = mid
        else:
            lo = mid
    model.bias = (lo + hi) / 2
    return model, rng


def _write_rows(model: _Model, rng: np.random.Generator, path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Draws ``n`` rows into ``path`` (through a temporary name); returns (labels, logits)."""
    tmp = path.with_name(f".{path.name}.tmp")
    labels_all, logits = [], []
    with open(tmp, "w") as f:
        done = 0
        while done < n:
            m = min(CHUNK_ROWS, n - done)
            logit, dense, cat = model.sample(rng, m)
            labels = (rng.random(m) < 1 / (1 + np.exp(-logit))).astype(np.int64)
            labels_all.append(labels)
            logits.append(logit)
            f.write("\n".join(_lines(labels, dense, cat)) + "\n")
            done += m
    os.replace(tmp, path)
    return np.concatenate(labels_all), np.concatenate(logits)


def generate_hours(root: str | os.PathLike, hours: int, start: str, rows_per_hour: int, seed: int = 1,
                   every_s: float = 0.0, shape: str = "small", scale: float = 1.0,
                   minutes: int = 60) -> signal.HourlySignal:
    """Writes ``hours`` partitions of ``minutes`` (module docstring; hourly
    ``root/YYYYMMDD/HH/`` by default, ``root/YYYYMMDD/HHMM/`` under an hour) from ``start``
    (``YYYYMMDD/HH``, or ``YYYYMMDD/HHMM`` under an hour), ``rows_per_hour`` Criteo rows
    each (rows per partition), then ``_SUCCESS``; sleeps ``every_s`` seconds between
    partitions (data that lands while a job runs). ``shape``: ``small`` | ``long-tail`` (module docstring), ``scale``: the
    long-tail shape's big vocabularies x ``scale``. Returns the ``signal.HourlySignal``
    written to ``root/signal.json`` (``runtime.formats.signal``).

    Raises ``ValueError`` for non-positive sizes or scale, an unknown shape,
    ``PartitionError`` for a bad ``start`` or ``minutes``.
    """
    from runtime.formats import partitions

    if hours <= 0 or rows_per_hour <= 0:
        raise ValueError(f"--hours and --rows must be > 0 (got {hours}, {rows_per_hour})")
    h0 = partitions.Partition.parse(start, "--start", minutes=minutes)
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    model, rng = _calibrated_model(seed, shape, scale)
    recs = []
    for t in range(hours):
        hour = h0.next(t)
        if t and hour.start.minute == 0:
            model.drift(rng)
        d = Path(hour.location(str(out)))
        if t and every_s > 0:
            time.sleep(every_s)
        d.mkdir(parents=True, exist_ok=True)
        labels, logits = _write_rows(model, rng, d / "part-00000", rows_per_hour)
        partitions.mark_complete(d)
        recs.append(signal.HourSignal(hour=str(hour), rows=rows_per_hour, ctr=round(float(labels.mean()), 6),
                                      true_logit_auc=round(auc(labels, logits), 6)))
        log.info("partition %s: %d rows, true-logit AUC %.4f", hour, rows_per_hour, recs[-1].true_logit_auc)
    rec = signal.HourlySignal(
        seed=seed, start=str(h0), partition_minutes=minutes, hours=recs, rows_per_hour=rows_per_hour, shape=shape, vocab_sizes=model.vocab,
        table_scale=scale, drift=signal.Drift(new_fraction=NEW_FRACTION, drift_slots=list(DRIFT_SLOTS),
                                              drift_sigma=DRIFT_SIGMA),
        generator=GENERATOR)
    signal.write(out, rec)
    return rec


def generate(out_dir: str | os.PathLike, rows: int, test_rows: int, seed: int = 1,
             extra_days: int = 0) -> signal.SplitSignal:
    """Writes ``out_dir/train.txt`` (``rows`` rows), ``out_dir/test.txt`` (``test_rows``)
    and ``out_dir/signal.json``; returns the ``signal.SplitSignal`` written there
    (``runtime.formats.signal``: ``true_logit_auc_test``, click rates, sizes, seed, model
    summary, seconds).

    ``extra_days`` > 0 also writes ``train-day2.txt`` .. ``train-day<extra_days+1>.txt``,
    ``rows`` rows each, drawn from the same model after the test split (so ``train.txt``
    and ``test.txt`` are the same with or without them): the "next days" of traffic that
    a retraining round adds.

    Raises ``ValueError`` for non-positive sizes or a negative ``extra_days``.
    """
    if rows <= 0 or test_rows <= 0:
        raise ValueError(f"--rows and --test-rows must be > 0 (got {rows}, {test_rows})")
    if extra_days < 0:
        raise ValueError(f"--extra-days must be >= 0 (got {extra_days})")
    t0 = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, rng = _calibrated_model(seed)
    stats = {}
    splits = [("train", rows), ("test", test_rows)]
    splits += [(f"train-day{d}", rows) for d in range(2, extra_days + 2)]
    for name, n in splits:
        labels, logits = _write_rows(model, rng, out / f"{name}.txt", n)
        stats[name] = float(labels.mean())
        if name == "test":
            stats["auc"] = auc(labels, logits)
    rec = signal.SplitSignal(
        seed=seed, rows=rows, test_rows=test_rows, format="criteo", files={name: f"{name}.txt" for name, _ in splits},
        true_logit_auc_test=round(stats["auc"], 6), ctr_train=round(stats["train"], 6),
        ctr_test=round(stats["test"], 6),
        model=signal.ModelSummary(
            vocab_sizes=model.vocab, missing_rates=np.round(model.miss, 4).tolist(),
            slot_weight_sigma=np.round(model.sigma, 4).tolist(), dense_beta=np.round(model.beta, 4).tolist(),
            interactions=["U[k3 % 8, k4 % 8] (slots 3 x 4)", "z_I1 * sign(w_5) (I1 x slot 5)"],
            bias=round(model.bias, 4)),
        generator=GENERATOR, seconds=round(time.monotonic() - t0, 2))
    signal.write(out, rec)
    return rec

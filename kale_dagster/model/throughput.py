"""Resource-throughput model: samples/s as a function of the worker count.

Kale's section 3.3 models one training iteration of a data-parallel job as
compute that shrinks with more workers plus communication that grows with
them.  Two forms:

* synchronous, global batch ``M``:  F(w) = M / (t0 + t1/w + t2/w^2 + t3*w)
* asynchronous:                     F(w) = w / (t0 + t1/w + t2*w)

Both are linear in theta once inverted (M/F and w/F are sums of known basis
functions of w), so theta is fitted with non-negative least squares on
measured (workers, samples/s) pairs, exactly as the paper does.

Because of the ``t3*w`` (or ``t2*w``) term the curve has a peak: past it,
adding workers lowers throughput.  :meth:`ThroughputModel.min_workers_for`
never returns more workers than the peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import nnls

from kale_dagster.errors import InputDataError, KaleConfigError

Form = Literal["sync", "async"]

_PARAMS = {"sync": 4, "async": 3}
_TABLE_LIMIT = 4096  # worker counts below this are read from the cached table


def _basis(form: Form, workers: np.ndarray) -> np.ndarray:
    w = np.asarray(workers, dtype=float)
    if form == "sync":
        return np.column_stack([np.ones_like(w), 1.0 / w, 1.0 / w**2, w])
    return np.column_stack([np.ones_like(w), 1.0 / w, w])


def _mape(actual: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - actual) / actual) * 100.0)


@dataclass(frozen=True)
class ThroughputModel:
    """A fitted (or given) throughput curve F(w).

    ``theta`` holds (t0, t1, t2, t3) for the synchronous form and (t0, t1, t2)
    for the asynchronous one; ``global_batch`` is M (synchronous only).
    ``fit_mape`` is the in-sample error and ``holdout_mape`` the
    leave-one-worker-count-out error, both in percent, when fitted.
    """

    form: Form
    theta: tuple[float, ...]
    global_batch: float | None = None
    fit_mape: float | None = None
    holdout_mape: float | None = None
    samples: int = 0
    # Per instance, computed once: policies ask for F(w) at the same few counts thousands of times per decision.
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self):
        if self.form not in _PARAMS:
            raise KaleConfigError("form", f"must be 'sync' or 'async', got {self.form!r}")
        if len(self.theta) != _PARAMS[self.form]:
            raise KaleConfigError(
                "theta", f"the {self.form} form takes {_PARAMS[self.form]} coefficients, got {len(self.theta)}"
            )
        if any(not math.isfinite(t) or t < 0 for t in self.theta):
            raise KaleConfigError("theta", f"coefficients must be finite and non-negative, got {self.theta}")
        if self.form == "sync" and not (self.global_batch and self.global_batch > 0):
            raise KaleConfigError("global_batch", "the synchronous form needs the global batch size M > 0")
        if sum(self.theta) == 0:
            raise KaleConfigError("theta", "all coefficients are zero, so throughput would be infinite")

    # --- constructors -------------------------------------------------------

    @classmethod
    def sync(cls, global_batch: float, theta: Sequence[float]) -> ThroughputModel:
        return cls("sync", tuple(float(t) for t in theta), global_batch=float(global_batch))

    @classmethod
    def asynchronous(cls, theta: Sequence[float]) -> ThroughputModel:
        return cls("async", tuple(float(t) for t in theta))

    @classmethod
    def linear(cls, per_worker_rate: float) -> ThroughputModel:
        """Perfect scaling, F(w) = rate * w: the asynchronous form with only t0."""
        if per_worker_rate <= 0:
            raise KaleConfigError("per_worker_rate", f"must be > 0, got {per_worker_rate}")
        return cls.asynchronous((1.0 / per_worker_rate, 0.0, 0.0))

    @classmethod
    def fit(
        cls,
        workers: ArrayLike,
        rates: ArrayLike,
        form: Form = "sync",
        global_batch: float | None = None,
    ) -> ThroughputModel:
        """Fit theta by non-negative least squares on measured (workers, samples/s) pairs.

        Needs at least as many distinct worker counts as the form has
        coefficients; with one more, also reports a leave-one-out MAPE so the
        user can tell a good fit from an overfit one.
        """
        w = np.asarray(workers, dtype=float)
        r = np.asarray(rates, dtype=float)
        if form not in _PARAMS:
            raise KaleConfigError("form", f"must be 'sync' or 'async', got {form!r}")
        if w.shape != r.shape or w.ndim != 1:
            raise InputDataError(f"workers and rates must be equal-length lists, got {w.shape} and {r.shape}")
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(r))) or np.any(w < 1) or np.any(r <= 0):
            raise InputDataError("measurements need workers >= 1 and a finite rate > 0 samples/s")
        if form == "sync" and not (global_batch and global_batch > 0):
            raise KaleConfigError("global_batch", "fitting the synchronous form needs the global batch size M > 0")
        distinct = np.unique(w)
        need = _PARAMS[form]
        if len(distinct) < need:
            raise InputDataError(
                f"the {form} model has {need} coefficients and needs measurements at >= {need} distinct "
                f"worker counts; got {len(distinct)} ({', '.join(str(int(x)) for x in distinct)}). "
                "Run the trainer at more parallelism levels first."
            )

        def solve(mask: np.ndarray) -> tuple[float, ...]:
            numerator = global_batch if form == "sync" else w[mask]
            theta, _ = nnls(_basis(form, w[mask]), numerator / r[mask])
            return tuple(float(t) for t in theta)

        theta = solve(np.ones_like(w, dtype=bool))
        batch = float(global_batch) if form == "sync" and global_batch is not None else None
        model = cls(form, theta, global_batch=batch)
        fit_mape = _mape(r, np.asarray(model.predict(w)))
        holdout = None
        if len(distinct) > need:
            errors = []
            for left_out in distinct:
                mask = w != left_out
                sub = cls(form, solve(mask), global_batch=model.global_batch)
                errors.append(np.abs(sub.predict(w[~mask]) - r[~mask]) / r[~mask])
            holdout = float(np.mean(np.concatenate(errors)) * 100.0)
        return cls(form, theta, global_batch=batch, fit_mape=fit_mape, holdout_mape=holdout, samples=len(w))

    # --- evaluation ---------------------------------------------------------

    def iteration_time(self, workers) -> np.ndarray:
        """Seconds per global batch (sync) or per sample per worker (async)."""
        w = np.asarray(workers, dtype=float)
        return _basis(self.form, np.atleast_1d(w)) @ np.asarray(self.theta)

    def predict(self, workers):
        """Samples/s at the given worker count(s); 0 workers give 0."""
        if type(workers) is int and 0 <= workers < _TABLE_LIMIT:  # the common call: one count, from the table
            table = self._cache.get("floats")
            if table is None or len(table) <= workers:
                table = self._cache["floats"] = self.capacities(workers).tolist()
            return table[workers]
        if np.ndim(workers) == 0:
            w = float(workers)
            if w.is_integer() and 0 <= w < _TABLE_LIMIT:
                return float(self.capacities(int(w))[int(w)])
        return self._evaluate(workers)

    def _evaluate(self, workers):
        w = np.atleast_1d(np.asarray(workers, dtype=float))
        out = np.zeros_like(w)
        pos = w > 0
        if np.any(pos):
            numerator = self.global_batch if self.form == "sync" else w[pos]
            out[pos] = numerator / self.iteration_time(w[pos])
        return float(out[0]) if np.ndim(workers) == 0 else out

    def capacities(self, max_workers: int) -> np.ndarray:
        """F(0), F(1), ... up to at least F(max_workers), as one cached array (read-only)."""
        table = self._cache.get("table")
        if table is None or len(table) <= max_workers:
            size = max(max_workers + 1, 2 * len(table) if table is not None else 33)
            table = np.asarray(self._evaluate(np.arange(size)), dtype=float)
            table.flags.writeable = False
            self._cache["table"] = table
        return table

    def peak_workers(self, max_workers: int) -> int:
        """The worker count in [1, max_workers] with the highest throughput (smallest on ties)."""
        if max_workers < 1:
            raise KaleConfigError("max_workers", f"must be >= 1, got {max_workers}")
        key = ("peak", max_workers)
        if key not in self._cache:
            rates = self.capacities(max_workers)[1 : max_workers + 1]
            # Treat rates within 1e-9 relative of the best as ties: a flat
            # tail must not be climbed for nothing.
            best = rates.max()
            self._cache[key] = int(np.argmax(rates >= best * (1 - 1e-9)) + 1)
        return self._cache[key]

    def min_workers_for(self, rate: float, max_workers: int, min_workers: int = 1) -> int:
        """Smallest w in [min_workers, peak] with F(w) >= rate; the peak when none suffices.

        Never more than the throughput peak: past it more workers are slower.
        """
        return int(self.min_workers_for_each(np.array([rate], dtype=float), max_workers, min_workers)[0])

    def min_workers_for_each(self, rates: np.ndarray, max_workers: int, min_workers: int = 1) -> np.ndarray:
        """:meth:`min_workers_for` of each rate, in one pass."""
        key = ("search", max_workers, min_workers)
        search = self._cache.get(key)
        if search is None:
            if min_workers < 0 or min_workers > max_workers:
                raise KaleConfigError("min_workers", f"must be in [0, max_workers={max_workers}], got {min_workers}")
            cap = self.peak_workers(max_workers)
            lo = max(min_workers, 1)
            # The first w whose F(w) reaches a rate is the first whose running maximum does, and the running
            # maximum is sorted: one binary search per rate (past the end, or NaN: none suffices, the peak).
            running = (
                np.maximum.accumulate(self.capacities(cap)[lo : cap + 1]) if lo < cap else None
            )  # else the floor wins
            search = self._cache[key] = (lo, cap, running)
        lo, cap, running = search
        rates = np.asarray(rates, dtype=float)
        out = np.full(len(rates), lo) if running is None else np.minimum(lo + np.searchsorted(running, rates), cap)
        return np.where(rates <= 0, min_workers, out)

    # --- serialisation (asset values, cursors) ------------------------------

    def to_dict(self) -> dict:
        return {
            "form": self.form,
            "theta": list(self.theta),
            "global_batch": self.global_batch,
            "fit_mape": self.fit_mape,
            "holdout_mape": self.holdout_mape,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ThroughputModel:
        return cls(
            data["form"],
            tuple(data["theta"]),
            global_batch=data.get("global_batch"),
            fit_mape=data.get("fit_mape"),
            holdout_mape=data.get("holdout_mape"),
            samples=int(data.get("samples", 0)),
        )

    def describe(self) -> str:
        coeffs = ", ".join(f"t{i}={t:.4g}" for i, t in enumerate(self.theta))
        head = (
            f"F(w) = {self.global_batch:g} / (t0 + t1/w + t2/w^2 + t3*w)"
            if self.form == "sync"
            else "F(w) = w / (t0 + t1/w + t2*w)"
        )
        return f"{head}; {coeffs}"


#: Measurements older than this are not fitted: the workers' code, data and hardware drift.
FIT_WINDOW_S = 7 * 86_400.0
#: A measurement under this share of its worker count's median saw a stall, not the workers' capacity.
STALL_SHARE = 0.5


def estimate_throughput(
    workers: ArrayLike,
    rates: ArrayLike,
    prior: ThroughputModel,
    form: Form = "async",
    global_batch: float | None = None,
) -> tuple[ThroughputModel, str]:
    """F(w) as a controller can know it: fitted on measured saturated throughput once the measurements
    cover as many worker counts as the form has coefficients, the declared ``prior`` until then.

    A measurement under ``STALL_SHARE`` of its worker count's median is left out: a window where a member stalled
    (an outside group's consumer left without partitions) shows the stall, not the workers' capacity, and would
    pull the curve flat.  The ``throughput_model`` asset, the savings report and the simulator's controller all
    estimate this way.
    """
    w, r = np.asarray(workers, dtype=float), np.asarray(rates, dtype=float)
    sizes = np.unique(w)
    if len(sizes) >= _PARAMS[form]:
        kept = np.ones(len(w), dtype=bool)
        for size in sizes:
            at = w == size
            kept[at] = r[at] >= STALL_SHARE * np.median(r[at])
        return ThroughputModel.fit(w[kept], r[kept], form=form, global_batch=global_batch), "fitted"
    return prior, "prior"

"""The residual correction of a base forecast (Prophet's, the seasonal base's): a direct multi-horizon linear model
of the base's log errors on their recent averages, one ridge regression per step ahead."""

from __future__ import annotations

import numpy as np

_WINDOWS_S = (0, 600, 1800, 3600, 7200, 14_400)  # residual averaging windows; 0 = the latest step


class ResidualCorrection:
    """Direct multi-horizon linear correction of a base model's log errors."""

    def __init__(self, step_s: float, horizon: int):
        windows = sorted({max(1, int(round(w / step_s))) for w in _WINDOWS_S})
        self.windows = windows
        self.horizon = horizon
        self.coef: np.ndarray | None = None
        self.on = True

    def features(self, resid: np.ndarray, lasts: np.ndarray) -> np.ndarray:
        filled = np.nan_to_num(resid)
        csum = np.concatenate([[0.0], np.cumsum(filled)])
        cols = [(csum[lasts + 1] - csum[np.maximum(lasts + 1 - w, 0)]) / w for w in self.windows]
        return np.column_stack(cols + [np.ones(len(lasts))])

    def fit(self, resid: np.ndarray, lasts: np.ndarray) -> ResidualCorrection:
        x = self.features(resid, lasts)
        y = np.stack([resid[np.minimum(lasts + h, len(resid) - 1)] for h in range(1, self.horizon + 1)], axis=1)
        y[lasts[:, None] + np.arange(1, self.horizon + 1)[None, :] >= len(resid)] = np.nan
        # One ridge regression per step ahead, each on the origins whose target and features are known: all steps'
        # normal equations at once, as weighted sums (weight 1 where known, 0 where not).
        k = x.shape[1]
        known = (np.isfinite(y) & np.all(np.isfinite(x), axis=1)[:, None]).astype(float)
        x, y = np.nan_to_num(x), np.nan_to_num(y)
        gram = (known.T @ (x[:, :, None] * x[:, None, :]).reshape(len(x), k * k)).reshape(self.horizon, k, k)
        moments = (x.T @ (known * y)).T  # (step, feature)
        enough = known.sum(axis=0) > k
        self.coef = np.zeros((k, self.horizon))
        if enough.any():
            solved = np.linalg.solve(gram[enough] + 1e-3 * np.eye(k), moments[enough][:, :, None])[:, :, 0]
            self.coef[:, enough] = solved.T
        return self

    def off(self) -> ResidualCorrection:
        """No correction, the base as it is: where the held-out days say the correction adds more noise than it
        removes (a base already right at every phase, learned from few origins)."""
        self.coef = np.zeros((len(self.windows) + 1, self.horizon))
        self.on = False
        return self

    def predict(self, resid: np.ndarray, lasts: np.ndarray) -> np.ndarray:
        return self.features(resid, lasts) @ self.coef

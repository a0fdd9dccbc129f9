"""Metrics history: stream telemetry, worker throughput and fitted forecasters, kept next to Dagster.

Times and rates are in the pipeline's units (``control.clock``: wall time
unless the run is compressed).  Rows a demo or a backfill wrote rather
than the metrics sensor are marked ``seeded``.  The latest fitted
forecasters are kept as blobs, so the controller (in the sensor's process)
re-uses what the refit run (in its own process) fitted.

Default storage is ``$KALE_HISTORY_URL`` when set, else SQLite under
``$DAGSTER_HOME/kale/metrics.db`` (so it
survives restarts of ``dagster dev`` and of the daemon); any SQLAlchemy URL
works, e.g. the ``postgresql://...`` URL of a Postgres-backed Dagster
(read with psycopg2, the driver dagster-postgres installs).  Rows
older than the retention are deleted on write; the default keeps 35 days,
i.e. the paper's 28 days at 1-minute resolution plus a margin.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa

from kale_dagster.errors import KaleConfigError

DEFAULT_RETENTION_DAYS = 35.0
#: Characters of a decision's reason the history keeps.
DECISION_CHARS = 400

_META = sa.MetaData()
STREAM_METRICS = sa.Table(
    "kale_stream_metrics",
    _META,
    sa.Column("pipeline", sa.String(200), primary_key=True),
    sa.Column("ts", sa.Float, primary_key=True),
    sa.Column("arrival_rate", sa.Float),
    sa.Column("consumption_rate", sa.Float),
    sa.Column("sample_lag", sa.BigInteger),
    sa.Column("time_lag_s", sa.Float),
    sa.Column("end_offset_total", sa.BigInteger),
    sa.Column("committed_total", sa.BigInteger),
    sa.Column("partitions", sa.Integer),
    sa.Column("workers", sa.Integer),
    sa.Column("seeded", sa.Boolean),
    # The trainer's progressive-validation metric at the reading (auc, mae, ...): quality beside lag.
    sa.Column("model_metric_name", sa.String(40)),
    sa.Column("model_metric", sa.Float),
    # The decision made at the reading: every one is here, while the event log keeps those that change something.
    sa.Column("decided_workers", sa.Integer),
    sa.Column("decision", sa.String(DECISION_CHARS)),
    # A restart (or an observed group's rebalance) under way at the reading: the savings report's downtime and
    # the restart time it simulates with.
    sa.Column("restarting", sa.Boolean),
)
WORKER_THROUGHPUT = sa.Table(
    "kale_worker_throughput",
    _META,
    sa.Column("pipeline", sa.String(200), primary_key=True),
    sa.Column("ts", sa.Float, primary_key=True),
    sa.Column("workers", sa.Integer, nullable=False),
    sa.Column("samples_per_s", sa.Float, nullable=False),
    sa.Column("emulated", sa.Boolean, nullable=False, default=False),
)

FORECASTERS = sa.Table(
    "kale_forecasters",
    _META,
    sa.Column("pipeline", sa.String(200), primary_key=True),
    sa.Column("ts", sa.Float, primary_key=True),  # when it was fitted
    sa.Column("model", sa.LargeBinary, nullable=False),  # the fitted forecaster, pickled
)
#: Fitted forecasters kept per pipeline.
KEEP_FORECASTERS = 3

_METRIC_COLUMNS = [
    c.name
    for c in STREAM_METRICS.columns
    if c.name
    not in (
        "pipeline",
        "ts",
        "workers",
        "seeded",
        "model_metric_name",
        "model_metric",
        "decided_workers",
        "decision",
        "restarting",
    )
]


def default_url() -> str:
    """``$KALE_HISTORY_URL`` if set, else SQLite under ``$DAGSTER_HOME/kale``."""
    if os.environ.get("KALE_HISTORY_URL"):
        return os.environ["KALE_HISTORY_URL"]
    home = os.environ.get("DAGSTER_HOME") or os.path.join(tempfile.gettempdir(), "kale-dagster-home")
    path = Path(home) / "kale" / "metrics.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


class MetricsHistory:
    """Append and read per-pipeline metric rows; bounded by ``retention_days``."""

    def __init__(self, url: str | None = None, retention_days: float = DEFAULT_RETENTION_DAYS):
        if retention_days <= 0:
            raise KaleConfigError("retention_days", f"must be > 0, got {retention_days}")
        self.url = url or default_url()
        self.retention_days = retention_days
        self.engine = sa.create_engine(_with_driver(self.url), future=True, pool_pre_ping=True)
        _META.create_all(self.engine)
        _add_missing_columns(self.engine)

    def append_stream(
        self,
        pipeline: str,
        ts: float,
        metrics: dict,
        workers: int | None = None,
        seeded: bool = False,
        model_metric: tuple[str, float] | None = None,
        decided: tuple[int, str] | None = None,
        restarting: bool | None = None,
    ) -> None:
        """One reading; ``decided`` is the decision made on it: (workers, the policy's reason); ``restarting``
        whether the launcher saw a restart under way."""
        name, value = model_metric or (None, None)
        decided_workers, decision = decided or (None, None)
        row = {
            "pipeline": pipeline,
            "ts": ts,
            "workers": workers,
            "seeded": seeded,
            "model_metric_name": name,
            "model_metric": value,
            "decided_workers": decided_workers,
            "decision": decision[:DECISION_CHARS] if decision else decision,
            "restarting": restarting,
        }
        row.update({k: metrics.get(k) for k in _METRIC_COLUMNS})
        self._upsert(STREAM_METRICS, row)
        self._trim(STREAM_METRICS, pipeline, ts)

    def seed_stream(self, pipeline: str, rows: pd.DataFrame) -> int:
        """Write many recorded rows at once (``ts`` and metric columns), marked ``seeded``; returns the count."""
        records = [
            {
                "pipeline": pipeline,
                "ts": float(r["ts"]),
                "seeded": True,
                "workers": None,
                **{k: r.get(k) for k in _METRIC_COLUMNS},
            }
            for r in rows.to_dict("records")
        ]
        if records:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.delete(STREAM_METRICS).where(
                        sa.and_(
                            STREAM_METRICS.c.pipeline == pipeline, STREAM_METRICS.c.ts.in_([r["ts"] for r in records])
                        )
                    )
                )
                conn.execute(sa.insert(STREAM_METRICS), records)
            self._trim(STREAM_METRICS, pipeline, max(r["ts"] for r in records))
        return len(records)

    def append_throughput(
        self, pipeline: str, ts: float, workers: int, samples_per_s: float, emulated: bool = False
    ) -> None:
        self._upsert(
            WORKER_THROUGHPUT,
            {"pipeline": pipeline, "ts": ts, "workers": workers, "samples_per_s": samples_per_s, "emulated": emulated},
        )
        self._trim(WORKER_THROUGHPUT, pipeline, ts)

    def stream(self, pipeline: str, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        """Stream metrics in [start, end] (epoch seconds) with a UTC ``timestamp`` column, oldest first."""
        return self._read(STREAM_METRICS, pipeline, start, end)

    def throughput(self, pipeline: str, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        return self._read(WORKER_THROUGHPUT, pipeline, start, end)

    def arrival_history(self, pipeline: str, start: float | None = None) -> pd.DataFrame:
        """``timestamp``/``rate`` rows with a known arrival rate: the forecaster's input."""
        frame = self.stream(pipeline, start)
        frame = frame[frame["arrival_rate"].notna()]
        return pd.DataFrame({"timestamp": frame["timestamp"], "rate": frame["arrival_rate"].astype(float)}).reset_index(
            drop=True
        )

    def save_forecaster(self, pipeline: str, fitted_at: float, model) -> None:
        blob = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
        self._upsert(FORECASTERS, {"pipeline": pipeline, "ts": fitted_at, "model": blob})
        with self.engine.begin() as conn:
            keep = (
                sa.select(FORECASTERS.c.ts)
                .where(FORECASTERS.c.pipeline == pipeline)
                .order_by(FORECASTERS.c.ts.desc())
                .limit(KEEP_FORECASTERS)
            )
            conn.execute(
                sa.delete(FORECASTERS).where(
                    sa.and_(FORECASTERS.c.pipeline == pipeline, FORECASTERS.c.ts.not_in(keep.scalar_subquery()))
                )
            )

    def latest_forecaster(self, pipeline: str, after: float | None = None) -> tuple[float, Any] | None:
        """(fitted_at, forecaster) of the latest fit, or None; with ``after``, only a fit newer than it."""
        query = sa.select(FORECASTERS.c.ts, FORECASTERS.c.model).where(FORECASTERS.c.pipeline == pipeline)
        if after is not None:
            query = query.where(FORECASTERS.c.ts > after)
        with self.engine.connect() as conn:
            row = conn.execute(query.order_by(FORECASTERS.c.ts.desc()).limit(1)).first()
        return (float(row.ts), pickle.loads(row.model)) if row is not None else None

    # --- internals ------------------------------------------------------------

    def _upsert(self, table: sa.Table, row: dict) -> None:
        key = sa.and_(table.c.pipeline == row["pipeline"], table.c.ts == row["ts"])
        with self.engine.begin() as conn:
            conn.execute(sa.delete(table).where(key))
            conn.execute(sa.insert(table).values(**row))

    def _trim(self, table: sa.Table, pipeline: str, now: float) -> None:
        cutoff = now - self.retention_days * 86_400
        with self.engine.begin() as conn:
            conn.execute(sa.delete(table).where(sa.and_(table.c.pipeline == pipeline, table.c.ts < cutoff)))

    def _read(self, table: sa.Table, pipeline: str, start: float | None, end: float | None) -> pd.DataFrame:
        query = sa.select(table).where(table.c.pipeline == pipeline)
        if start is not None:
            query = query.where(table.c.ts >= start)
        if end is not None:
            query = query.where(table.c.ts <= end)
        with self.engine.connect() as conn:
            # Rows as tuples: a sensor tick reads the history several times, and dicts cost 10x more to frame.
            frame = pd.DataFrame(
                conn.execute(query.order_by(table.c.ts)).all(), columns=[c.name for c in table.columns]
            )
        frame.insert(0, "timestamp", pd.to_datetime(frame["ts"], unit="s", utc=True))
        return frame.drop(columns=["pipeline"])

    def dispose(self) -> None:
        self.engine.dispose()


def _with_driver(url: str) -> sa.engine.URL:
    """A plain ``postgresql://`` URL read as dagster-postgres reads it, with psycopg2 (SQLAlchemy 2 would pick psycopg
    3)."""
    parsed = sa.engine.make_url(url)
    return parsed.set(drivername="postgresql+psycopg2") if parsed.drivername == "postgresql" else parsed


def describe_database_error(exc: Exception) -> str:
    """One line for a skip reason: the driver's first line, without SQLAlchemy's statement and parameters."""
    orig = getattr(exc, "orig", None) or exc
    first = next((line.strip() for line in str(orig).splitlines() if line.strip()), "")
    return f"{type(orig).__name__}: {first}"[:300]


def _add_missing_columns(engine) -> None:
    """Columns added since a database was created (nullable ones only), so an older history keeps working."""
    inspector = sa.inspect(engine)
    for table in _META.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have and column.nullable:
                with engine.begin() as conn:
                    conn.execute(
                        sa.text(
                            f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {column.type.compile(engine.dialect)}'
                        )
                    )

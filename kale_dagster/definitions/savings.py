"""``<pipeline>/savings``: the savings report as an asset, materialized daily, and the one entry ``kale report``
shares with it (``sim.savings`` computes it).

The asset's first metadata entry is the report's summary line, so the UI's asset page opens on it; the table,
the plot (arrivals, what ran, what Kale would have run) and the inputs the simulation was given follow.
"""

import time

import pandas as pd
from dagster import AssetExecutionContext, AssetKey, AssetsDefinition, Failure, MetadataValue, Output, asset

from kale_dagster.definitions.assets import plot_path
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.policies import POLICIES
from kale_dagster.sim.savings import (
    DAY_S,
    MAX_WARMUP_DAYS,
    ReportRefused,
    SavingsReport,
    fmt_band,
    savings_report,
)


def pipeline_savings(
    p: OnlineTrainingPipeline, days: float | None = None, end: float | None = None
) -> tuple[SavingsReport, pd.DataFrame, pd.DataFrame]:
    """The report over the pipeline's last ``days`` (``report_days``) to ``end`` (now), Kale's simulated timeline
    and the readings it scored (the plot's)."""
    days = p.report_days if days is None else days
    end = p.clock.now() if end is None else end
    history = p.history()
    try:
        begin = end - (days + MAX_WARMUP_DAYS) * DAY_S
        stream = history.stream(p.name, start=begin, end=end)
        throughput = history.throughput(p.name, start=begin, end=end)
    finally:
        history.dispose()
    policy = p.policy if p.policy == "kale" or POLICIES[p.policy].variant_of == "kale" else "kale"
    report, timeline = savings_report(
        p.name,
        stream,
        throughput,
        p.limits,
        days=days,
        end=end,
        prior=p.throughput_prior,
        global_batch=p.global_batch,
        forecaster=p.forecaster,
        policy=policy,
        baselines=tuple(p.report_baselines),
    )
    return report, timeline, stream[stream["ts"] >= report.start]


def report_rows(report: SavingsReport) -> list[tuple[str, dict, bool, str]]:
    """(label, figures, simulated, setting) per row: what ran, Kale, each baseline at its best setting."""
    rows = [("ran (measured)", report.ran, False, ""), ("Kale (simulated)", report.kale, True, "")]
    for name, best in report.baselines.items():
        setting = ", ".join(f"{k}={v}" for k, v in best["setting"].items())
        rows.append((f"{name}, best tuned", best, True, setting))
    return rows


def report_table(report: SavingsReport) -> str:
    """The report as a Markdown table; simulated figures with the simulator's band."""
    e = report.error
    lines = [
        "| | GPU h | acc. lag (min) | min over SLO | restarts |",
        "|---|---|---|---|---|",
    ]
    for label, m, simulated, setting in report_rows(report):
        gpu = fmt_band(m["gpu_hours"], e.gpu_hours if simulated else None)
        lag = fmt_band(m["accumulated_lag_minutes"], e.accumulated_lag_minutes if simulated else None)
        label = f"{label} ({setting})" if setting else label
        lines.append(f"| {label} | {gpu} | {lag} | {m['minutes_over_slo']:,.0f} | {m['rescales']} |")
    return "\n".join(lines)


def savings_asset(p: OnlineTrainingPipeline) -> AssetsDefinition:
    @asset(
        key=p.key("savings"),
        group_name=p.name,
        kinds={"pandas"},
        deps=[AssetKey(p.key("stream_metrics"))],
        description=f"What ran over the last {p.report_days:g} day{'' if p.report_days == 1 else 's'} (measured) "
        f"beside what Kale and the best tuned {' and '.join(p.report_baselines) or 'baselines'} would have run on the "
        "same arrivals (simulated, with the simulator's measured error).",
    )
    def savings(context: AssetExecutionContext) -> Output:
        from kale_dagster.definitions.plots import plot_metadata, plot_savings

        try:
            report, timeline, ran = pipeline_savings(p)
        except ReportRefused as exc:  # what is missing, in the run's failure, without a traceback to read past
            raise Failure(description=f"no savings report for {p.name!r}: {exc}", allow_retries=False) from None
        png = plot_savings(ran, timeline, p.limits.slo_minutes, plot_path(context, p, "savings"), report.summary())
        value = report.to_json()
        return Output(
            value,
            metadata={
                "summary": MetadataValue.text(report.summary()),
                "gpu_hours_saved_pct": round(100 * value["gpu_hours_saved"]["point"], 1),
                "report": MetadataValue.md(report_table(report)),
                "plot": plot_metadata(png),
                "from": MetadataValue.text(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(report.start))),
                "to": MetadataValue.text(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(report.end))),
                "throughput_model": report.inputs.model,
                "restart_time": report.inputs.restart,
                "simulator_error": report.error.measured,
            },
        )

    return savings

"""Asset checks of one pipeline: quality gates an operator sees next to the assets."""

from dagster import AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, AssetKey, asset_check

from kale_dagster.definitions.assets import STALE_METRICS_S
from kale_dagster.definitions.decision import LAG_CHECK, lag_within_slo, latest_metadata
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.forecast.naive import DAY_S


def forecast_accuracy_check(p: OnlineTrainingPipeline) -> AssetChecksDefinition:
    forecast_key = AssetKey(p.key("traffic_forecast"))

    @asset_check(
        asset=forecast_key,
        name="forecast_beats_seasonal_naive",
        description="Warns when the forecasts of the last day fared worse, against what arrived, than repeating the "
        "rate "
        "a day earlier (held-out error until forecasts have been realised).",
    )
    def forecast_accuracy(context) -> AssetCheckResult:
        since = p.clock.now() - DAY_S
        records = context.instance.fetch_materializations(forecast_key, limit=500).records
        fits = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]
        fits = [m for m in fits if m.get("fitted_at", 0) >= since and m.get("realised_points")]
        if fits:
            points = sum(m["realised_points"] for m in fits)
            model = sum(m["realised_smape"] * m["realised_points"] for m in fits) / points
            base = sum(m["realised_baseline_smape"] * m["realised_points"] for m in fits) / points
            return AssetCheckResult(
                passed=bool(model <= base),
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "realised_smape": model,
                    "realised_baseline_smape": base,
                    "realised_points": points,
                    "fits": len(fits),
                },
            )
        meta = latest_metadata(context.instance, forecast_key)
        model, base = meta.get("holdout_smape"), meta.get("baseline_smape")
        if model is None or base is None:
            return AssetCheckResult(
                passed=True, severity=AssetCheckSeverity.WARN, metadata={"note": "not enough history to compare yet"}
            )
        return AssetCheckResult(
            passed=bool(model <= base),
            severity=AssetCheckSeverity.WARN,
            metadata={
                "holdout_smape": model,
                "baseline_smape": base,
                "note": "held-out error: no forecast of the last day realised yet",
            },
        )

    return forecast_accuracy


def lag_slo_check(p: OnlineTrainingPipeline) -> AssetChecksDefinition:
    @asset_check(
        asset=AssetKey(p.key("gpu_allocation")),
        name=LAG_CHECK,
        description=f"Measured time lag is within the {p.limits.slo_minutes:g}-minute SLO. The metrics sensor "
        "evaluates it at every reading; running the check evaluates the latest recorded one.",
    )
    def lag_slo(context) -> AssetCheckResult:
        latest = p.history().stream(p.name, start=p.clock.now() - STALE_METRICS_S)
        if latest.empty:
            return AssetCheckResult(
                passed=False, severity=AssetCheckSeverity.WARN, metadata={"note": "no recent stream metrics"}
            )
        passed, severity, verdict = lag_within_slo(float(latest["time_lag_s"].iloc[-1]), p.limits.slo_s)
        return AssetCheckResult(passed=passed, severity=severity, metadata=verdict)

    return lag_slo


def pipeline_checks(p: OnlineTrainingPipeline) -> list:
    return [forecast_accuracy_check(p), lag_slo_check(p)]

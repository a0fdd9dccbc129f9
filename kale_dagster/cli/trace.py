"""``kale trace synth``: write a seeded synthetic arrival trace."""

from __future__ import annotations

from pathlib import Path

from kale_dagster.sim.trace import synth_trace


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser("trace", help=summary)
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    synth = sub.add_parser(
        "synth",
        help="write a synthetic diurnal trace shaped like the paper's production traffic",
        description="Seeded synthetic trace: ~7.65x swing between the 04:00 trough and the 20:00 peak, "
        "busier weekends, AR(1) noise and occasional bursts. Output: CSV timestamp,value (arrivals per step).",
        epilog="example: kale trace synth --days 14 --seed 0 --out t.csv",
    )
    synth.add_argument("--days", type=float, gt=0, le=366, default=7.0)
    synth.add_argument("--seed", type=int, ge=0, le=2**32 - 1, default=0)
    synth.add_argument("--step-seconds", type=float, ge=1, le=86_400, default=60.0)
    synth.add_argument("--peak-rate", type=float, gt=0, le=1e9, default=10_000.0, help="weekday peak in samples/s")
    synth.add_argument("--out", required=True, help="CSV path to write")
    synth.set_defaults(handler=run_synth)


def run_synth(args) -> int:
    frame = synth_trace(days=args.days, seed=args.seed, step_s=args.step_seconds, peak_rate=args.peak_rate)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    print(f"wrote {len(frame)} rows ({args.days:g} days at {args.step_seconds:g} s) to {out}")
    return 0

"""``otel-train compare A B``: its arguments and what it prints (docs/compare.md).

Exit status: 0, or 1 when ``--fail-if-slower`` finds B slower beyond both its threshold
and noise, or 2 when the runs cannot be read or compared."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..settings.verdicts import VerdictSettings
from .compare import compare, gate
from .compare_text import text
from .live import fetch_run
from .noise import SEED, TOLERANCE
from .record_data import Run, load_run
from .run_verdicts import run_verdicts
from .steady import WARMUP_STEPS


def _metric(value: str) -> str:
    if value in ("step", "tokens_per_s", "samples_per_s") or (
        value.startswith("phase:") and len(value) > 6
    ):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r}: accepted step, phase:NAME (phase:forward), tokens_per_s, samples_per_s"
    )


def add_parser(sub: argparse._SubParsersAction, duration: Callable[[str], float]) -> None:  # type: ignore[type-arg]
    """``duration``: the type of --last (cli.py's, as ``report --last`` has it)."""
    p = sub.add_parser("compare", help="compare run B against run A: steady steps, per phase, "
                       "with noise intervals (and a CI gate)")  # fmt: skip
    p.add_argument("a", metavar="A", help="run directory (or, with --prometheus, a job)")
    p.add_argument("b", metavar="B", help="run directory (or, with --prometheus, a job)")
    p.add_argument("--json", action="store_true", help="print JSON (schemas/compare.schema.json)")
    p.add_argument("--fail-if-slower", type=float, metavar="PCT", default=None,
                   help="exit 1: B slower than A by over PCT%% and beyond noise")  # fmt: skip
    p.add_argument("--metric", type=_metric, default="step",
                   help="what --fail-if-slower reads: step, phase:NAME, tokens_per_s, "
                   "samples_per_s (default step)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=WARMUP_STEPS,
                   help=f"first steps left out of each run (default {WARMUP_STEPS})")  # fmt: skip
    p.add_argument("--seed", type=int, default=SEED, help=f"bootstrap seed (default {SEED})")
    p.add_argument("--tolerance", type=float, default=100 * TOLERANCE, metavar="PCT",
                   help="changes under PCT%% read as within noise (default "
                   f"{100 * TOLERANCE:g})")  # fmt: skip
    p.add_argument("--verdict", action="append", default=[], metavar="NAME=VALUE",
                   help="a verdict threshold (docs/compare.md): verdict_drift=0.2")  # fmt: skip
    p.add_argument("--prometheus", metavar="URL", help="A and B are jobs in this Prometheus")
    p.add_argument("--jaeger", metavar="URL", help="with --prometheus: traces from this Jaeger")
    p.add_argument("--last", type=duration, default=3600.0,
                   help="with --prometheus: how far back (30m, 6h, 2d; default 1h)")  # fmt: skip


def _load(args: argparse.Namespace, which: str) -> Run:
    if args.prometheus:
        return fetch_run(args.prometheus, args.jaeger, which, args.last)
    if not Path(which).is_dir():
        raise ValueError(f"{which}: no such run directory")
    return load_run(which)


def main(args: argparse.Namespace) -> int:
    if args.warmup < 0 or not 0 <= args.tolerance < 100:
        print("otel-train compare: --warmup takes 0 or more steps, --tolerance 0 to 100",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        a, b = _load(args, args.a), _load(args, args.b)
        result = compare(a, b, (args.a, args.b), args.warmup, args.seed, args.tolerance / 100)
        limits = VerdictSettings.resolve(dict(x.partition("=")[::2] for x in args.verdict))
        result["verdicts"] = {"a": run_verdicts(a, limits, args.warmup),
                              "b": run_verdicts(b, limits, args.warmup)}  # fmt: skip
        failed = None
        if args.fail_if_slower is not None:
            failed = gate(result, args.metric, args.fail_if_slower)
            result["gate"] = {"metric": args.metric, "pct": args.fail_if_slower,
                              "failed": failed is not None, "reason": failed or ""}  # fmt: skip
    except (OSError, ValueError) as err:
        print(f"otel-train compare: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else text(result))
    if failed:
        print(f"otel-train compare: FAIL: {failed}", file=sys.stderr)
        return 1
    if args.fail_if_slower is not None:
        print(f"otel-train compare: pass: {args.metric} not slower by more than "
              f"{args.fail_if_slower:g}% beyond noise", file=sys.stderr)  # fmt: skip
    return 0

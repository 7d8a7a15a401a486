"""``otel-train compare A B``: two runs' steady steps side by side (steady.py), each
figure's B/A ratio of medians with its bootstrap interval (noise.py), and what differs
in their set-up (facts.py). The result is plain JSON values (``schemas/compare.schema.json``);
compare_text.py writes it as a table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import contract as c
from . import figures as f
from .facts import differences
from .noise import LEVEL, ROUNDS, SEED, SEPARATED, TOLERANCE, Ratio, ratio_of_medians, spread
from .record_data import Run
from .steady import WARMUP_STEPS, Sample, Steady, steady
from .summary import peak_memory

# Per-sample figures: (name, kind, how to read it from a sample). Kind "time": lower is
# better; "rate": higher is better; "share": neither (a share of the step).
Getter = Callable[[Sample], float | None]


def step_seconds(s: Sample) -> float:
    return s.seconds


FIGURES: tuple[tuple[str, str, Getter], ...] = (
    ("step", "time", step_seconds),
    ("samples_per_s", "rate", lambda s: s.samples_per_s),
    ("tokens_per_s", "rate", lambda s: s.tokens_per_s),
    ("mfu", "rate", lambda s: s.mfu),
    ("data_stall", "share", lambda s: s.data_stall),
    ("collective_wait", "time", lambda s: s.collective_wait),
)


def _values(samples: list[Sample], get: Getter) -> list[float]:
    return [float(v) for v in map(get, samples) if v is not None]


def change(kind: str, r: Ratio, tolerance: float) -> tuple[str, str]:
    """(verdict, words): within noise, or faster/slower, higher/lower with the interval."""
    if not r.beyond_noise(tolerance):
        return "within noise", "within noise"
    up = r.ratio > 1.0
    words = ("faster", "slower") if kind == "time" else ("lower", "higher")
    verdict = words[up]
    if up:
        pct, lo, hi = r.ratio - 1.0, r.low - 1.0, r.high - 1.0
    else:
        pct, lo, hi = 1.0 - r.ratio, 1.0 - r.high, 1.0 - r.low
    return (
        verdict,
        f"{100 * pct:.0f}% {verdict} ({LEVEL:.0%} interval {100 * lo:.0f}-{100 * hi:.0f}%)",
    )


def row(metric: str, kind: str, a: list[float], b: list[float], seed: int,
        tolerance: float) -> dict[str, Any] | None:  # fmt: skip
    """One figure's comparison; None when either run lacks it or both are all 0 (no
    collectives ran)."""
    if not a or not b or (not any(a) and not any(b)):
        return None
    r = ratio_of_medians(a, b, seed)
    out: dict[str, Any] = {"metric": metric, "kind": kind}
    out.update(a_median=r.a if r else None, a_spread=spread(a), a_samples=len(a))
    out.update(b_median=r.b if r else None, b_spread=spread(b), b_samples=len(b))
    if r is None:  # A's median is 0 (no collectives, no stall): no ratio
        out.update(a_median=sorted(a)[len(a) // 2], b_median=sorted(b)[len(b) // 2])
        out.update(ratio=None, low=None, high=None, a_thirds=None, b_thirds=None)
        out.update(thirds_apart=None, separation=None)
        out.update(verdict="no ratio", change="A is 0")
        return out
    verdict, words = change(kind, r, tolerance)
    out.update(ratio=r.ratio, low=r.low, high=r.high, a_thirds=r.a_thirds, b_thirds=r.b_thirds)
    out.update(thirds_apart=r.thirds_apart(), separation=r.separation)
    out.update(verdict=verdict, change=words)
    return out


def rows(a: list[Sample], b: list[Sample], seed: int, tolerance: float) -> list[dict[str, Any]]:
    out = []
    for name, kind, get in FIGURES:
        out.append(row(name, kind, _values(a, get), _values(b, get), seed, tolerance))
    phases = sorted({p for s in a for p in s.phases} & {p for s in b for p in s.phases})
    for p in phases:

        def get(s: Sample, p: str = p) -> float | None:
            return s.phases.get(p)

        out.append(row(f"phase:{p}", "time", _values(a, get), _values(b, get), seed, tolerance))
    return [r for r in out if r is not None]


def _side(path: str, states: list[Steady]) -> dict[str, Any]:
    left: dict[str, int] = {}
    for s in states:
        for why, n in s.left_out.items():
            left[why] = left.get(why, 0) + n
    return {"path": path, "ranks": [s.rank for s in states],
            "unit": states[0].unit if states else "step",
            "steady": sum(s.steps for st in states for s in st.samples),
            "samples": sum(len(s.samples) for s in states), "left_out": left}  # fmt: skip


def _memory(a: Run, b: Run) -> list[dict[str, Any]]:
    pa = {k: v for r in a.ranks for k, v in peak_memory(r).items()}
    pb = {k: v for r in b.ranks for k, v in peak_memory(r).items()}
    return [{"phase": p, "a": pa.get(p), "b": pb.get(p)} for p in sorted({*pa, *pb})]


def _goodput(run: Run) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in run.ranks:
        for k, v in f.by_category(f.last_values(r, c.RUN_TIME.name)).items():
            totals[k] = totals.get(k, 0.0) + v
    wall = sum(totals.values())
    return {k: v / wall for k, v in sorted(totals.items())} if wall > 0 else {}


def compare(a: Run, b: Run, names: tuple[str, str], warmup: int = WARMUP_STEPS,
            seed: int = SEED, tolerance: float = TOLERANCE) -> dict[str, Any]:  # fmt: skip
    """The comparison of run ``b`` against run ``a`` (``names``: theirs, for the output)."""
    sa = [steady(r, warmup) for r in a.ranks]
    sb = [steady(r, warmup) for r in b.ranks]
    if not any(s.samples for s in sa) or not any(s.samples for s in sb):
        raise ValueError("a run has no steady steps to compare (too short for its warm-up?)")
    pooled_a = [x for s in sa for x in s.samples]
    pooled_b = [x for s in sb for x in s.samples]
    per_rank = []
    if len(sa) > 1 and len(sb) > 1:
        by_b = {s.rank: s for s in sb}
        for s in sa:
            other = by_b.get(s.rank)
            if other is not None:
                step = row("step", "time", _values(s.samples, step_seconds),
                           _values(other.samples, step_seconds), seed, tolerance)  # fmt: skip
                per_rank.append({"rank": s.rank, "rows": [step] if step else []})
    return {
        "a": _side(names[0], sa),
        "b": _side(names[1], sb),
        "method": {
            "statistic": "ratio of medians, B / A",
            "interval": "percentile block bootstrap",
            "thirds": "every third of B (its samples in thirds by time) beyond every "
            "third of A, one way",
            "separation": f"P(a sample of B > one of A) at least {SEPARATED} or at most "
            f"{1 - SEPARATED:.2f}",
            "level": LEVEL,
            "rounds": ROUNDS,
            "seed": seed,
            "tolerance": tolerance,
            "warmup_steps": warmup,
        },
        "rows": rows(pooled_a, pooled_b, seed, tolerance),
        "ranks": per_rank,
        "memory": _memory(a, b),
        "goodput": {"a": _goodput(a), "b": _goodput(b)},
        "settings": differences(a, b),
    }


def find_row(result: dict[str, Any], metric: str) -> dict[str, Any] | None:
    return next((r for r in result["rows"] if r["metric"] == metric), None)


def gate(result: dict[str, Any], metric: str, pct: float) -> str | None:
    """Why B fails ``--fail-if-slower pct`` on ``metric``: a slowdown beyond ``pct`` and
    beyond noise (its whole interval slower, the thirds apart, the steps separated:
    noise.py); None when it passes."""
    r = find_row(result, metric)
    if r is None:
        raise ValueError(f"--metric {metric}: not in both runs; "
                         f"have: {', '.join(x['metric'] for x in result['rows'])}")  # fmt: skip
    if r["ratio"] is None:
        return None
    if r["kind"] == "rate":  # slower: fewer per second
        slow, worst_case = 1.0 / r["ratio"] - 1.0, 1.0 / r["low"] - 1.0 if r["low"] else 0.0
        best_case = 1.0 / r["high"] - 1.0
    else:
        slow, best_case = r["ratio"] - 1.0, r["low"] - 1.0
        worst_case = r["high"] - 1.0
    apart = not 1.0 - SEPARATED < r["separation"] < SEPARATED and r["thirds_apart"]
    if slow * 100 > pct and best_case > 0 and apart:
        interval = f"95% interval {100 * best_case:.1f}-{100 * worst_case:.1f}%"
        return f"{metric} {100 * slow:.1f}% slower ({interval}), beyond {pct:g}% and noise"
    return None

"""``otel-train compare``'s table: the comparison (compare.py) as terminal text."""

from __future__ import annotations

from typing import Any

from ..processing.console import fmt_bytes, fmt_seconds


def _value(kind: str, metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if kind == "time":
        return fmt_seconds(v)
    if kind == "share" or metric == "mfu":
        return f"{100 * v:.1f}%"
    return f"{v:,.1f}"


def _side_line(label: str, side: dict[str, Any]) -> str:
    left = ", ".join(f"{n} {why}" for why, n in sorted(side["left_out"].items())) or "none"
    unit = "steps" if side["unit"] == "step" else f"steps in {side['samples']} intervals"
    ranks = f"rank {side['ranks'][0]}" if len(side["ranks"]) == 1 else f"{len(side['ranks'])} ranks"
    return f"{label}: {side['path']} ({ranks}): {side['steady']} steady {unit}; left out: {left}"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'figure':<24}{'A median':>12}{'A IQR':>11}{'B median':>12}{'B IQR':>11}"
             f"{'B/A':>7}{'thirds':>8}{'P(B>A)':>8}  change"]  # fmt: skip
    for r in rows:
        k, m = r["kind"], r["metric"]
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        held = {True: "apart", False: "overlap", None: "-"}[r["thirds_apart"]]
        apart = f"{r['separation']:.2f}" if r["separation"] is not None else "-"
        lines.append(f"{m:<24}{_value(k, m, r['a_median']):>12}{_value(k, m, r['a_spread']):>11}"
                     f"{_value(k, m, r['b_median']):>12}{_value(k, m, r['b_spread']):>11}"
                     f"{ratio:>7}{held:>8}{apart:>8}  {r['change']}")  # fmt: skip
    return lines


def headline(result: dict[str, Any]) -> str:
    """One line: what changed beyond noise, and what did not."""
    moved = [f"{r['metric']} {r['change']}" for r in result["rows"]
             if r["verdict"] not in ("within noise", "no ratio")]  # fmt: skip
    still = [r["metric"] for r in result["rows"] if r["verdict"] == "within noise"]
    out = "B against A: " + ("; ".join(moved) if moved else "no change beyond noise")
    return out + (f"; within noise: {', '.join(still)}" if moved and still else "")


def text(result: dict[str, Any]) -> str:
    m = result["method"]
    lines = [_side_line("A", result["a"]), _side_line("B", result["b"]),
             f"medians over steady {result['a']['unit']}s (the first {m['warmup_steps']} "
             f"steps are warm-up); B/A with a {m['level']:.0%} percentile block bootstrap "
             f"interval ({m['rounds']} rounds, seed {m['seed']}); a change counts beyond noise "
             f"when its interval leaves out 1, it is over {100 * m['tolerance']:g}%, it holds "
             "over the whole of both runs (every third of B beyond every third of A), and "
             f"the steps are apart: P(B > A) {m['separation'].split(') ', 1)[1]}",
             ""]  # fmt: skip
    lines += [headline(result), "", *_table(result["rows"])]
    for r in result["ranks"]:
        lines += [f"rank {r['rank']}:", *_table(r["rows"])[1:]]
    memory = [x for x in result["memory"] if x["a"] is not None or x["b"] is not None]
    if memory:
        lines += ["", f"{'peak allocated':<24}{'A':>12}{'B':>12}"]
        lines += [f"{x['phase']:<24}{fmt_bytes(x['a']):>12}{fmt_bytes(x['b']):>12}" for x in memory]
    goodput = result["goodput"]
    cats = sorted({*goodput["a"], *goodput["b"]})
    if cats:
        lines += ["", f"{'goodput (share of wall)':<24}{'A':>12}{'B':>12}"]
        for k in cats:
            a, b = goodput["a"].get(k), goodput["b"].get(k)
            lines.append(f"{k:<24}{_value('share', k, a):>12}{_value('share', k, b):>12}")
    lines.append("")
    for side in ("a", "b"):
        found = result.get("verdicts", {}).get(side)
        if found is not None:
            lines.append(f"verdicts {side.upper()}:")
            lines += [f"  {line}" for line in found or ["none"]]
    if result["settings"]:
        lines.append("set-up that differs (could explain a change):")
        lines += [f"  {s['name']}: {s['a']} -> {s['b']}" for s in result["settings"]]
    else:
        lines.append("set-up: no difference the records show")
    return "\n".join(lines)

"""The report page's comparison section (``otel-train report A --against B``): the two
runs' steady medians per phase and for the step, side by side, with compare.py's change
and its interval, as plain JSON values for report.js."""

from __future__ import annotations

from typing import Any

from .compare import compare
from .record_data import Run


def against_data(a: Run, b: Run, names: tuple[str, str]) -> dict[str, Any]:
    result = compare(a, b, names)
    m = result["method"]
    rows = [
        {"name": r["metric"].removeprefix("phase:"), "a": r["a_median"], "b": r["b_median"],
         "change": r["change"], "verdict": r["verdict"]}
        for r in result["rows"]
        if r["kind"] == "time" and r["metric"] != "collective_wait"
    ]  # fmt: skip
    return {
        "a": names[0],
        "b": names[1],
        "rows": rows,
        "method": f"medians over {result['a']['steady']} and {result['b']['steady']} steady "
        f"steps; B/A with a {m['level']:.0%} block bootstrap interval ({m['rounds']} rounds, "
        f"seed {m['seed']}); within noise unless the interval leaves out 1, the change is "
        f"over {100 * m['tolerance']:g}%, every third of B is beyond every third of A and "
        f"P(B > A) is {m['separation'].split(') ', 1)[1]} (docs/compare.md)",
    }

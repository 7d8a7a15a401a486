"""Every phase name an adapter emits is documented in the telemetry contract."""

from __future__ import annotations

import ast
from pathlib import Path

from otel_train import contract as c

ADAPTERS = Path(__file__).resolve().parents[2] / "otel_train" / "adapters"
PHASE_CALLS = {"enter", "boundary", "exit_if_top", "phase"}


def phase_literals(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Attribute) and node.func.attr in PHASE_CALLS)
            or (isinstance(node.func, ast.Name) and node.func.id in PHASE_CALLS)
        ):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
    return found


def test_adapter_phase_names_are_in_the_contract() -> None:
    names: set[str] = set()
    for path in sorted(ADAPTERS.glob("*.py")):
        names |= phase_literals(path)
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert names <= set(c.ADAPTER_PHASES), sorted(names - set(c.ADAPTER_PHASES))

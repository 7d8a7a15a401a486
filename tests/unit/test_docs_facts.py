"""The figures and names the README and docs/ quote, checked against their source: every
telemetry name against the contract (otel_train/contract/, what docs/telemetry.md is
generated from), every ``OTEL_TRAIN_*`` variable against the code that reads it, and the
series budgets against tests/series_budget.py, which the stack tests count against."""

from __future__ import annotations

import importlib
import re
from dataclasses import fields
from pathlib import Path

from series_budget import SERIES_PER_DDP_RANK, SERIES_PER_RANK

from otel_train import contract as c
from otel_train.settings import ENV_PREFIX, Settings
from otel_train.settings.verdicts import VerdictSettings

ROOT = Path(__file__).resolve().parents[2]
# Hand-written pages; docs/telemetry.md is generated from the contract (test_contract.py).
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "telemetry.md"),
]
REFERENCE = c.render_markdown()


def quoted(*patterns: str) -> dict[str, list[str]]:
    """Each match of the patterns (its first group, else the whole match) in the pages,
    with the pages it is in."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for pattern in patterns:
            for m in re.finditer(pattern, page.read_text()):
                found.setdefault(m.group(1) if m.groups() else m.group(0), []).append(page.name)
    return found


def python_object(dotted: str) -> bool:
    """Whether ``dotted`` names a module of otel-train or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_otel_train_name_is_in_the_contract_or_the_package() -> None:
    contract_names = set(re.findall(r"otel_train(?:\.[a-z_0-9]+)+", REFERENCE))
    assert "otel_train.step" in contract_names and "otel_train.dropped" in contract_names
    names = quoted(r"otel_train(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
    unknown = {n: pages for n, pages in names.items()
               if n not in contract_names and not python_object(n)}  # fmt: skip
    assert not unknown, f"names the contract and the package do not have: {unknown}"


def test_every_prometheus_name_is_in_the_contract() -> None:
    """``otel_train_*`` series and labels (recording rules' ``a:b:c`` names aside)."""
    contract_names = set(re.findall(r"otel_train_[a-z_0-9]+", REFERENCE))
    contract_names |= {n for spec in c.METRICS for n in c.prometheus_names(spec)}
    contract_names |= {c.prometheus_label(a.key) for a in c.RESOURCE_ATTRIBUTES}
    names = quoted(r"(?<![:\w])(otel_train_[a-z_0-9]+)(?![:\w])")
    unknown = {n: pages for n, pages in names.items() if n not in contract_names}
    assert not unknown, f"Prometheus names the contract does not make: {unknown}"


def test_every_otel_train_variable_is_read_by_the_code() -> None:
    """A setting's variable (its name, upper-cased: the settings and the verdicts'
    thresholds), or a name the code spells out."""
    source = "\n".join(p.read_text() for p in (ROOT / "otel_train").rglob("*.py"))
    known = set(re.findall(r"OTEL_TRAIN_[A-Z0-9_]*[A-Z0-9]", source))
    names = [*Settings.names(), *(f.name for f in fields(VerdictSettings))]
    known |= {f"{ENV_PREFIX}{n.upper()}" for n in names}
    assert "OTEL_TRAIN_RUN_ID" in known and "OTEL_TRAIN_HANG_AFTER" in known
    names = quoted(r"OTEL_TRAIN_[A-Z0-9_]*[A-Z0-9]")
    unknown = {n: pages for n, pages in names.items() if n not in known}
    assert not unknown, f"variables otel-train does not read: {unknown}"


def test_the_series_budgets_quoted_are_the_tested_ones() -> None:
    per_rank = quoted(r"at most \**(\d+)\** series", r"(\d+) series a rank")
    per_ddp_rank = quoted(r"DDP rank[^.]{0,30}?at most \**(\d+)", r"(\d+) for a DDP rank")
    assert set(per_rank) == {str(SERIES_PER_RANK)}, per_rank
    assert set(per_ddp_rank) == {str(SERIES_PER_DDP_RANK)}, per_ddp_rank
    # The capacity plan states both, where the budget is explained.
    assert "scale.md" in per_rank[str(SERIES_PER_RANK)]
    assert "scale.md" in per_ddp_rank[str(SERIES_PER_DDP_RANK)]

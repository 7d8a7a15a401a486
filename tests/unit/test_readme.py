"""The README is short and what it says runs; the docs site holds the rest.

- docs/configuration.md's settings table is the Settings dataclass, rendered;
- the README's two commands are the Makefile's, and CI runs the test one;
- every path, link and `make` target the README names exists on a clone; every docs page
  it links to is in the site's navigation (mkdocs.yml), which scripts/test builds with
  ``mkdocs build --strict``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import yaml

import otel_train
from otel_train import contract as c
from otel_train.settings import Settings, settings_table
from otel_train.testing import InMemoryTelemetry

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
MAX_README_LINES = 200


def test_the_settings_table_matches_settings() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    pattern = r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->"
    block = re.search(pattern, text, re.S)
    assert block is not None, "docs/configuration.md lost its settings-table markers"
    assert block.group(1) == settings_table()


def test_every_setting_is_documented() -> None:
    table = settings_table()
    for name in Settings.names():
        assert f"| `{name}` |" in table


def test_readme_names_the_two_commands_and_ci_runs_the_test_one() -> None:
    assert "make demo" in README and "make test" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in ci
    assert re.search(r"^test:.*\n\tscripts/test$", MAKEFILE, re.M)
    assert re.search(r"^demo:.*\n\tscripts/demo$", MAKEFILE, re.M)


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES


def test_every_make_target_the_readme_names_exists() -> None:
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, re.M))
    named = set(re.findall(r"\bmake ([\w-]+)", README))
    assert named and named <= targets, named - targets


def test_every_path_the_readme_names_exists() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [x for x in links if "://" not in x]
    paths = re.findall(r"`((?:docs|examples|scripts|tests|deploy|benchmarks)/[\w./-]+)`", README)
    assert relative and paths
    missing = [p for p in relative + paths if not (ROOT / p).exists()]
    assert not missing, missing


def test_every_docs_page_the_readme_links_is_in_the_site() -> None:
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: object) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        items = nav.values() if isinstance(nav, dict) else nav
        return set().union(*(pages(x) for x in items))  # type: ignore[union-attr]

    in_nav = pages(site["nav"])
    linked = {x.removeprefix("docs/") for x in re.findall(r"\]\((docs/[\w.-]+\.md)", README)}
    assert linked and linked <= in_nav, linked - in_nav
    assert {p.name for p in (ROOT / "docs").glob("*.md")} - in_nav <= {"install.md"}


def test_the_readme_lists_every_extra() -> None:
    """(pyproject.toml's [project.optional-dependencies], read as text: no TOML parser
    on Python 3.10 without another dependency)"""
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^\[project\.optional-dependencies\]\n(.*?)^\[", pyproject, re.M | re.S)
    assert block is not None
    extras = set(re.findall(r"^([\w-]+) = \[", block.group(1), re.M))
    rows = set(re.findall(r"^\| `([\w-]+)` \|", README, re.M))
    assert "docs" in extras and rows == extras, (rows, extras)


def test_the_readme_loop_runs_as_written() -> None:
    """The first Python example, on a small model and a loader of dict batches, with
    in-memory providers configured first (the example's ``instrument()`` names no
    settings, so it takes that session): one step per batch."""
    code = re.search(r"```python\n(.*?)```", README, re.S)
    assert code is not None and "otel_train.instrument(model" in code.group(1)
    tel = InMemoryTelemetry()
    otel_train.configure(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider,
                         trace_steps="all", console="off")  # fmt: skip
    data = [{"x": torch.randn(4), "y": torch.randn(1)} for _ in range(24)]
    model = torch.nn.Linear(4, 1)
    scope = {
        "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=0.01),
        "loader": torch.utils.data.DataLoader(data, batch_size=8),
        "loss_fn": torch.nn.functional.mse_loss,
    }
    exec(compile(code.group(1), "README.md", "exec"), scope)
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert len(steps) == 3
    assert {p.attributes["name"] for p in tel.points(c.SCALAR.name)} == {"loss"}

"""The README's configuration table is the Settings dataclass, rendered."""

from __future__ import annotations

import re
from pathlib import Path

from otel_train.settings import Settings, settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_readme_settings_table_matches_settings() -> None:
    text = (ROOT / "README.md").read_text()
    pattern = r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->"
    block = re.search(pattern, text, re.S)
    assert block is not None, "README lost its settings-table markers"
    assert block.group(1) == settings_table()


def test_every_setting_is_documented() -> None:
    table = settings_table()
    for name in Settings.names():
        assert f"| `{name}` |" in table


def test_readme_names_the_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\n\tscripts/test$", makefile, re.M)
    assert re.search(r"^demo:.*\n\tscripts/demo$", makefile, re.M)

"""What the rule tests of tests/stack share: running ``promtool test rules`` on a rule file
of deploy/prometheus/rules/, and an alert's annotations as Prometheus's templating fills
them in."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml


def run_promtool(
    stack_bins: Path, rules: Path, tests: list[dict], interval: str, tmp_path: Path
) -> None:
    """promtool's unit tests ``tests`` of ``rules``, evaluated every ``interval``."""
    spec = {"rule_files": [str(rules)], "evaluation_interval": interval, "tests": tests}
    path = tmp_path / f"{rules.stem}_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run(
        [str(stack_bins / "promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def annotations(rules: Path, alert: str, rank: int, value: float) -> dict[str, str]:
    """The annotations of ``alert`` for rank ``rank`` of job "train" with value ``value``
    (its ``{{ $value | printf "..." }}`` formats applied)."""
    specs = [r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]]
    spec = next(r for r in specs if r.get("alert") == alert)
    out = {}
    for key, text in spec["annotations"].items():
        text = re.sub(r'\{\{ \$value \| printf "([^"]+)" \}\}', lambda m: m.group(1) % value, text)
        text = text.replace("{{ $labels.otel_train_rank }}", str(rank))
        out[key] = text.replace("{{ $labels.job }}", "train")
    return out

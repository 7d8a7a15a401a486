"""/metrics over real HTTP: otel-train builds its own SDK and serves the Prometheus endpoint."""

from __future__ import annotations

import time
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import otel_train
from otel_train import contract as c

N_STEPS = 6
SCOPE_LABELS = (
    f'otel_scope_name="{c.SCOPE_NAME}",otel_scope_schema_url="{c.SCHEMA_URL}",'
    f'otel_scope_version="{otel_train.__version__}"'
)
LE = [
    "0.0001",
    "0.00025",
    "0.0005",
    "0.001",
    "0.0025",
    "0.005",
    "0.01",
    "0.025",
    "0.05",
    "0.1",
    "0.25",
    "0.5",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "25.0",
    "50.0",
    "100.0",
    "250.0",
    "600.0",
    "+Inf",
]


def scrape(address: tuple[str, int]) -> str:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def wait_for_steps(address: tuple[str, int], steps: int, timeout_s: float = 10.0) -> str:
    """Scrape until the worker has processed ``steps`` steps (bounded)."""
    want = f"otel_train_steps_total{{{SCOPE_LABELS}}} {float(steps)}"
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(address)
        if want in text.splitlines() or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(var, raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    otel_train.instrument(model, optimizer=opt, prometheus_port=0, console="off")
    session = otel_train.session.current()
    assert session is not None and session.telemetry.owned  # no providers given: its own SDK
    address = session.prometheus_address
    assert address is not None and address[0] == "127.0.0.1" and address[1] > 0
    for _ in range(N_STEPS):
        with otel_train.step(samples=16, tokens=16 * 32):
            with otel_train.phase("data"):
                x = torch.randn(16, 8)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        otel_train.record(loss=loss)
    return address


def test_scrape_finds_phase_memory_throughput_and_counters(served: tuple[str, int]) -> None:
    text = wait_for_steps(served, N_STEPS)
    found = samples(text)

    phase_bucket, _, phase_count = c.prometheus_names(c.PHASE_DURATION, source="scrape")
    assert phase_bucket == "otel_train_phase_duration_seconds_bucket"
    phases = {s.labels["phase"] for s in found[phase_bucket]}
    assert phases == {"data", "forward", "backward", "optimizer"}
    for s in found[phase_count]:
        assert s.value == N_STEPS
        assert s.labels["clock"] == "host"

    (rss_name,) = c.prometheus_names(c.PROCESS_MEMORY_RSS, source="scrape")
    assert rss_name == "process_memory_usage_bytes"
    assert found[rss_name][0].value > 1_000_000
    (peak_rss_name,) = c.prometheus_names(c.PROCESS_MEMORY_PEAK_RSS, source="scrape")
    assert found[peak_rss_name][0].value > 1_000_000

    (tput,) = c.prometheus_names(c.THROUGHPUT_FLOPS, source="scrape")
    assert tput == "otel_train_throughput_flops_per_second"
    assert found[tput][0].value > 0

    for spec, expected in (
        (c.STEPS, N_STEPS),
        (c.SAMPLES, 16 * N_STEPS),
        (c.TOKENS, 16 * 32 * N_STEPS),
    ):
        (name,) = c.prometheus_names(spec, source="scrape")
        assert name.endswith("_total")
        assert [s.value for s in found[name]] == [expected]

    (scalar,) = c.prometheus_names(c.SCALAR, source="scrape")
    assert [s.labels["name"] for s in found[scalar]] == ["loss"]
    step_count = c.prometheus_names(c.STEP_DURATION, source="scrape")[2]
    assert found[step_count][0].value == N_STEPS

    # No series without CUDA that only CUDA can give.
    for spec in (c.PHASE_MEMORY_PEAK, c.DEVICE_MEMORY_LIMIT):
        if not torch.cuda.is_available():
            assert c.prometheus_base_name(spec, source="scrape") not in text

    # Every otel_train series scraped is a name the contract predicts.
    specs = [*c.METRICS, *(old for old, _ in c.DEPRECATED_METRICS)]
    predicted = {n for m in specs for n in c.prometheus_names(m, source="scrape")}
    scraped = {n for n in found if n.startswith(("otel_train_", "process_", "system_", "hw_"))}
    assert scraped <= predicted, scraped - predicted


def test_exposition_format_is_exact(served: tuple[str, int]) -> None:
    text = wait_for_steps(served, N_STEPS)
    lines = text.splitlines()

    base = c.prometheus_base_name(c.PHASE_DURATION, source="scrape")
    assert f"# HELP {base} {c.PHASE_DURATION.description}" in lines
    assert f"# TYPE {base} histogram" in lines
    assert "# TYPE otel_train_steps_total counter" in lines
    assert f"# HELP otel_train_steps_total {c.STEPS.description}" in lines
    assert "# TYPE otel_train_throughput_flops_per_second gauge" in lines
    assert f"otel_train_steps_total{{{SCOPE_LABELS}}} {float(N_STEPS)}" in lines
    assert f"otel_train_samples_total{{{SCOPE_LABELS}}} {float(16 * N_STEPS)}" in lines

    for phase in ("data", "forward", "backward", "optimizer"):
        prefix = f'{base}_bucket{{clock="host",le="'
        suffix = f'",{SCOPE_LABELS},phase="{phase}"}}'
        bucket_lines = [
            ln for ln in lines if ln.startswith(prefix) and ln.rsplit(" ", 1)[0].endswith(suffix)
        ]
        les = [ln[len(prefix) :].split('"', 1)[0] for ln in bucket_lines]
        assert les == LE  # seconds-scale bounds, in order, ending in +Inf
        counts = [float(ln.rsplit(" ", 1)[1]) for ln in bucket_lines]
        assert counts == sorted(counts)  # cumulative
        assert counts[-1] == N_STEPS
        count_line = f'{base}_count{{clock="host",{SCOPE_LABELS},phase="{phase}"}} {float(N_STEPS)}'
        assert count_line in lines

    (target_info,) = [ln for ln in lines if ln.startswith("target_info{")]
    assert 'otel_train_rank="0"' in target_info
    assert 'service_name="otel-train"' in target_info
    assert f'otel_train_version="{otel_train.__version__}"' in target_info
    assert f'otel_train_torch_version="{torch.__version__}"' in target_info
    compiled = c.prometheus_base_name(c.TORCH_COMPILED, source="scrape")
    assert f"{compiled}{{{SCOPE_LABELS}}} 0.0" in lines


def test_metrics_endpoint_stops_at_shutdown(served: tuple[str, int]) -> None:
    wait_for_steps(served, N_STEPS)
    assert otel_train.shutdown()
    with pytest.raises(OSError):
        scrape(served)


def test_metrics_binds_other_interfaces_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_PROMETHEUS_HOST",
        "OTEL_TRAIN_PROMETHEUS_HOST",
    ):
        monkeypatch.delenv(var, raising=False)
    session = otel_train.configure(prometheus_host="0.0.0.0", prometheus_port=0, console="off")
    try:
        address = session.prometheus_address
        assert address is not None and address[0] == "0.0.0.0"
    finally:
        otel_train.shutdown()

"""Configuration: precedence, and bad values failing at instrument() naming the setting."""

from __future__ import annotations

import logging
import socket

import pytest
import torch
from otel_helpers import attached, providers

import otel_train
from otel_train.settings import ConfigError, Settings, settings_table
from otel_train.testing import InMemoryTelemetry

# setting -> (bad keyword value, bad environment value, a fragment of the accepted values,
# or a pair of fragments: keyword, environment)
BAD = {
    "service_name": (123, "x" * 3000, ("must be a string", "at most 2048 characters")),
    "default_service_name": ("", "   ", "must be a non-empty string"),
    "role": (7, "x" * 3000, ("must be a string", "at most 2048 characters")),
    "otlp_endpoint": ("collector:4318", "grpc://collector:4317", "http://"),
    "otlp_protocol": ("thrift", "http/json", "'http/protobuf', 'grpc'"),
    "prometheus": ("maybe", "enabled", "true/false"),
    "prometheus_host": ("", "   ", "host name or IP address"),
    "prometheus_port": (70000, "http", "integer from 0 to 65535"),
    "prometheus_ranks": ("every", "rank0", "'offset', 'first', 'all'"),
    "metric_export_interval": (0.0, "fast", "number from 0.1 to 3600"),
    "console_every": (-1, "1.5", "integer from 0 to"),
    "console": ("file", "stdout2", "'stderr', 'stdout', 'off'"),
    "console_ranks": ("zero", "every", "'first', 'all'"),
    "sidecar": ("process", "on", "'auto', 'off'"),
    "trace_steps": ("some", "1", "'sampled', 'all', 'none'"),
    "trace_window": (0, "0", "integer from 1 to"),
    "trace_window_seconds": (0, "nan", "number from 0.01 to 86400"),
    "trace_slowest": (-1, "1001", "integer from 0 to 1000"),
    "device_timing": ("gpu", "", "'auto', 'cuda', 'off'"),
    "hang_after": (0.5, "soon", "'auto', 'off' or seconds from 1 to 604800"),
    "memory": ("2", "maybe", "true/false"),
    "reset_peak_memory": ("sometimes", "-1", "true/false"),
    "flush_on_sigterm": ("later", "2", "true/false"),
    "max_pending_steps": (0, "many", "integer from 1 to"),
    "shutdown_timeout": (-1, "forever", "number from 0 to 600"),
    "batch_dim": (2, "seq", "integer from 0 to 1"),
    "throughput_window": (1, "1", "integer from 2 to"),
    "profile_steps": ("12-10", "10-", "step range FIRST-LAST"),
    "memory_snapshot": ("always", "5-x", "'off', 'oom' or a step range"),
    "debug_dir": ("", "   ", "directory path"),
    "run_dir": ("", "   ", "'off' or a directory path"),
    "run_record_mb": (0, "big", "integer from 1 to"),
    "flops": ("measure", "on", "'count', 'estimate', 'off'"),
    "flops_per_step": (-1.0, "lots", "number from 0 to"),
    "flops_count_step": (-1, "second", "integer from 0 to"),
    "peak_tflops": (0, "fast", "number from 1e-06 to"),
    "peak_dtype": ("int8", "float32", "'auto', 'fp32', 'tf32', 'bf16', 'fp16', 'fp8'"),
}


def test_every_setting_has_bad_values_under_test() -> None:
    assert set(BAD) == set(Settings.names())


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_keyword_value_fails_at_instrument_naming_the_setting(name: str) -> None:
    bad, _, accepted = BAD[name]
    accepted = accepted[0] if isinstance(accepted, tuple) else accepted
    tel = InMemoryTelemetry()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError) as raised:
        otel_train.instrument(model, **{name: bad}, **providers(tel))
    message = str(raised.value)
    assert f"'{name}'" in message
    assert f"argument {name}=" in message
    assert accepted in message
    assert not attached(model)  # nothing attached
    assert otel_train.session.current() is None


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_environment_value_fails_at_instrument_naming_the_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bad, accepted = BAD[name]
    accepted = accepted[1] if isinstance(accepted, tuple) else accepted
    monkeypatch.setenv(f"OTEL_TRAIN_{name.upper()}", bad)
    tel = InMemoryTelemetry()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError) as raised:
        otel_train.instrument(model, **providers(tel))
    message = str(raised.value)
    assert f"'{name}'" in message
    assert f"OTEL_TRAIN_{name.upper()}" in message
    assert accepted in message
    assert not attached(model)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(otel_train.ConfigError, ValueError)


@pytest.mark.parametrize(
    ("variable", "bad", "setting"),
    [
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "ninety", "prometheus_port"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "otlp_protocol"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "50", "metric_export_interval"),
    ],
)
def test_bad_standard_variable_names_the_setting_and_the_variable(
    variable: str, bad: str, setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, bad)
    with pytest.raises(ConfigError) as raised:
        otel_train.configure(**providers(InMemoryTelemetry()))
    assert f"'{setting}'" in str(raised.value)
    assert variable in str(raised.value)


@pytest.mark.parametrize("call", ["instrument", "configure"])
def test_unknown_setting_is_a_config_error(call: str) -> None:
    tel = InMemoryTelemetry()
    with pytest.raises(ConfigError) as raised:
        if call == "instrument":
            otel_train.instrument(torch.nn.Linear(2, 2), trace_step="all", **providers(tel))
        else:
            otel_train.configure(promethues_port=1, **providers(tel))
    message = str(raised.value)
    assert "unknown otel_train setting" in message
    assert "trace_step" in message or "promethues_port" in message
    assert "trace_steps" in message and "prometheus_port" in message  # lists the accepted


def test_port_in_use_is_a_config_error_naming_prometheus_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(var, raising=False)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        model = torch.nn.Linear(2, 2)
        with pytest.raises(ConfigError) as raised:
            otel_train.instrument(model, prometheus_port=port, console="off")
        message = str(raised.value)
        assert "'prometheus_port'" in message
        assert str(port) in message
        assert "already in use" in message
        assert not attached(model)
        assert otel_train.session.current() is None


# -- precedence: keyword > OTEL_TRAIN_* > standard OTEL_* > default --------------------------


def test_precedence_for_prometheus_port() -> None:
    env = {"OTEL_TRAIN_PROMETHEUS_PORT": "9100", "OTEL_EXPORTER_PROMETHEUS_PORT": "9200"}
    assert Settings.resolve({"prometheus_port": 9000}, env).prometheus_port == 9000
    assert Settings.resolve({}, env).prometheus_port == 9100
    assert Settings.resolve({}, {"OTEL_EXPORTER_PROMETHEUS_PORT": "9200"}).prometheus_port == 9200
    assert Settings.resolve({}, {}).prometheus_port == 9464


def test_precedence_for_metric_export_interval_in_milliseconds() -> None:
    env = {"OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "3", "OTEL_METRIC_EXPORT_INTERVAL": "2500"}
    assert Settings.resolve({"metric_export_interval": 1.5}, env).metric_export_interval == 1.5
    assert Settings.resolve({}, env).metric_export_interval == 3.0
    only_std = {"OTEL_METRIC_EXPORT_INTERVAL": "2500"}
    assert Settings.resolve({}, only_std).metric_export_interval == 2.5
    assert Settings.resolve({}, {}).metric_export_interval == 10.0


def test_precedence_for_protocol_and_host() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0"}
    s = Settings.resolve({}, env)
    assert (s.otlp_protocol, s.prometheus_host) == ("grpc", "0.0.0.0")
    s = Settings.resolve(
        {"otlp_protocol": "http/protobuf"}, {**env, "OTEL_TRAIN_PROMETHEUS_HOST": "127.0.0.2"}
    )
    assert (s.otlp_protocol, s.prometheus_host) == ("http/protobuf", "127.0.0.2")
    assert Settings.resolve({}, {}).prometheus_host == "127.0.0.1"


def test_precedence_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRAIN_CONSOLE_EVERY", "7")
    monkeypatch.setenv("OTEL_TRAIN_TRACE_STEPS", " ALL ")
    monkeypatch.setenv("OTEL_TRAIN_MEMORY", "off")
    s = Settings.resolve()
    assert (s.console_every, s.trace_steps, s.memory) == (7, "all", False)
    assert Settings.resolve({"console_every": 3}).console_every == 3
    sess = otel_train.configure(**providers(InMemoryTelemetry()))
    assert sess.settings.console_every == 7


def test_defaults() -> None:
    s = Settings.resolve({}, {})
    assert s == Settings()
    assert (s.prometheus, s.prometheus_host, s.prometheus_port) == (True, "127.0.0.1", 9464)
    assert (s.otlp_protocol, s.trace_steps, s.console_every) == ("http/protobuf", "sampled", 100)


def test_values_are_parsed_to_their_types() -> None:
    s = Settings.resolve(
        {
            "prometheus": "no",
            "console_every": "25",
            "trace_window_seconds": "2.5",
            "otlp_endpoint": " http://collector:4318 ",
            "service_name": "  ",
        },
        {},
    )
    assert s.prometheus is False
    assert s.console_every == 25
    assert s.trace_window_seconds == 2.5
    assert s.otlp_endpoint == "http://collector:4318"
    assert s.service_name is None
    with pytest.raises(ConfigError, match="'console_every'"):
        Settings.resolve({"console_every": 2.5}, {})
    with pytest.raises(ConfigError, match="'prometheus'"):
        Settings.resolve({"prometheus": 1}, {})


def test_settings_table_lists_every_setting_and_its_variable() -> None:
    table = settings_table()
    for name in Settings.names():
        assert f"`{name}`" in table
        assert f"`OTEL_TRAIN_{name.upper()}`" in table


def test_a_misspelled_variable_is_warned_once_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OTEL_TRAIN_CONSOLE_EVRY (a typo) at instrument(): one warning naming the setting
    it is closest to, however many times settings are resolved; the run id, the test
    switches and the settings themselves give none."""
    monkeypatch.setenv("OTEL_TRAIN_CONSOLE_EVRY", "5")
    monkeypatch.setenv("OTEL_TRAIN_XYZZY_PLUGH", "1")
    monkeypatch.setenv("OTEL_TRAIN_RUN_ID", "r1")
    monkeypatch.setenv("OTEL_TRAIN_BROWSER_REQUIRED", "1")
    monkeypatch.setenv("OTEL_TRAIN_CONSOLE_EVERY", "7")
    monkeypatch.setenv("OTEL_TRAIN_VERDICT_DRIFT", "0.2")  # (a verdict's threshold)
    tel = InMemoryTelemetry()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        sess = otel_train.configure(console="off", **providers(tel))
        assert sess.settings.console_every == 7
        otel_train.shutdown()
        Settings.resolve()
    said = [r.getMessage() for r in caplog.records if "environment variable" in r.getMessage()]
    assert len(said) == 2, said
    (typo,) = [m for m in said if "OTEL_TRAIN_CONSOLE_EVRY" in m]
    assert "did you mean OTEL_TRAIN_CONSOLE_EVERY?" in typo
    (other,) = [m for m in said if "OTEL_TRAIN_XYZZY_PLUGH" in m]
    assert "did you mean" not in other

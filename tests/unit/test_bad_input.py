"""Property tests (hypothesis, fixed budget: see tests/conftest.py) over what users hand us.

Phase names, step counts, user scalars (NaN, inf, huge numbers and strings, tensors of
every dtype and shape on CPU and ``meta``) and batches never crash training nor switch
telemetry off; attribute sizes stay bounded; nothing from a batch's contents becomes
an attribute; every configuration value either resolves or fails with one ConfigError
naming the setting, at ``instrument()``, before anything is attached.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from otel_helpers import attached, providers

import otel_train
from otel_train import contract as c
from otel_train.recording.recorder import MAX_MESSAGE, MAX_NAME
from otel_train.settings import ENV_PREFIX, ConfigError, Settings
from otel_train.testing import InMemoryTelemetry

MAX_STACKTRACE = 8192
INT64_MAX = 2**63 - 1

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip

huge_text = st.text(min_size=2000, max_size=20_000).map(lambda t: t * 3)
any_text = st.one_of(st.text(max_size=300), huge_text)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    device = draw(st.sampled_from(["cpu", "meta"]))
    if device == "meta" or (dtype.is_floating_point and dtype.itemsize == 1):
        return torch.empty(shape, dtype=dtype, device=device)
    value = draw(st.one_of(st.floats(allow_nan=True), st.integers(-(2**70), 2**70)))
    try:
        return torch.full(shape, value, dtype=dtype)
    except (RuntimeError, OverflowError):
        return torch.zeros(shape, dtype=dtype)


anything = st.one_of(
    any_text, numbers, tensors(), st.none(), st.binary(max_size=64),
    st.lists(st.integers(), max_size=3), st.tuples(st.integers(), st.integers()),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip


def run(body: Callable[[], None], **settings: Any) -> InMemoryTelemetry:
    """Run ``body`` under a fresh session; telemetry must still be on at the end."""
    tel = InMemoryTelemetry()
    session = otel_train.configure(  # (on the thread: its worker is read below)
        **providers(tel), console="off", trace_steps="all", sidecar="off", **settings
    )
    try:
        body()
        assert session.recorder.enabled, "telemetry switched itself off"
        assert session.worker.process() >= 0 and not session.worker.failed
    finally:
        otel_train.shutdown()
    return tel


def attribute_values(tel: InMemoryTelemetry) -> Iterator[tuple[str, Any]]:
    """Every (key, value) in span, event and metric attributes."""
    for span in tel.spans():
        yield from span.attributes.items()
        for event in span.events:
            yield from event.attributes.items()
    for metric in tel.metrics().values():
        for point in metric.data.data_points:
            yield from (point.attributes or {}).items()


def check_bounded(tel: InMemoryTelemetry) -> None:
    for span in tel.spans():
        assert len(span.name) <= MAX_NAME
        assert span.status.description is None or len(span.status.description) <= 256
        for event in span.events:
            for key, value in event.attributes.items():
                limit = MAX_STACKTRACE if key == "exception.stacktrace" else MAX_MESSAGE
                assert not isinstance(value, str) or len(value) <= limit, key
    for key, value in attribute_values(tel):
        if isinstance(value, str) and not key.startswith("exception."):
            assert len(value) <= 4096, key  # names are cut to 128; paths stay short
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value <= INT64_MAX, key  # OTLP ints are int64


@given(name=st.one_of(any_text, anything))
def test_any_phase_name_is_recorded_with_a_bounded_name(name: Any) -> None:
    def body() -> None:
        with otel_train.step(), otel_train.phase(name):
            pass

    tel = run(body)
    (span,) = [s for s in tel.spans() if s.name != c.STEP_SPAN.name]
    expected = (name if isinstance(name, str) else str(name))[:MAX_NAME] or "unnamed"
    assert span.name == expected
    check_bounded(tel)


@given(samples=anything, tokens=anything)
def test_any_step_counts_are_kept_or_left_out(samples: Any, tokens: Any) -> None:
    def body() -> None:
        with otel_train.step(samples=samples, tokens=tokens), otel_train.phase("work"):
            pass

    tel = run(body)
    (step,) = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    for key, given_value in ((c.STEP_SAMPLES.key, samples), (c.STEP_TOKENS.key, tokens)):
        value = step.attributes.get(key)
        assert value is None or (isinstance(value, int) and 0 <= value <= INT64_MAX)
        if type(given_value) is int and 0 <= given_value <= INT64_MAX:
            assert value == given_value
    check_bounded(tel)


@given(scalars=st.dictionaries(st.one_of(any_text, st.just("loss")), anything, max_size=4))
def test_any_user_scalar_is_recorded_or_skipped(scalars: dict[str, Any]) -> None:
    def body() -> None:
        with otel_train.step(), otel_train.phase("work"):
            otel_train.record(**scalars)
        otel_train.record(**scalars)  # also outside a step

    with LogRecords("opentelemetry") as sdk_logs:
        tel = run(body)
        points = tel.points(c.SCALAR.name)
    assert not sdk_logs, sdk_logs  # e.g. no "non-finite value" warning at every collection
    for point in points:
        assert isinstance(point.value, float) and math.isfinite(point.value)
        assert len(point.attributes[c.A_NAME]) <= MAX_NAME
    recorded = {p.attributes[c.A_NAME]: p.value for p in points}
    finite = [v for v in scalars.values() if type(v) is float and math.isfinite(v)]
    for key, value in scalars.items():
        if type(value) is float and math.isfinite(value):
            assert recorded[(key or "unnamed")[:MAX_NAME]] in finite
    check_bounded(tel)


class LogRecords(logging.Handler):
    """Collects WARNING+ records of one logger while in the ``with`` block."""

    def __init__(self, logger: str) -> None:
        super().__init__(logging.WARNING)
        self.logger = logging.getLogger(logger)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.logger.addHandler(self)
        return self.records

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self)


def _floats(scalars: dict[str, Any]) -> list[float]:
    return [v for v in scalars.values() if type(v) is float]


@given(message=any_text, exc_type=st.sampled_from([ValueError, RuntimeError, KeyError]))
def test_errors_with_huge_messages_give_bounded_attributes(
    message: str, exc_type: type[Exception]
) -> None:
    raised: list[BaseException] = []
    error = exc_type(message)

    def body() -> None:
        try:
            with otel_train.step(), otel_train.phase("work"):
                raise error
        except exc_type as err:
            raised.append(err)

    tel = run(body)
    assert raised == [error]  # passed through unchanged
    (span,) = [s for s in tel.spans() if s.name == "work"]
    assert [e.name for e in span.events] == ["exception"]
    check_bounded(tel)


SECRET = "s3cr3t-batch-content"


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    """Batches carrying content that must never reach telemetry: a marker string and a
    distinctive value in every tensor."""
    value = draw(st.sampled_from([7777.25, -31337.5, 424242.0]))
    size = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["tuple", "dict", "nested"]))
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 3))):
        x = torch.full((size, 8), value)
        text = [f"{SECRET}-{draw(st.text(max_size=20))}"] * size
        if kind == "tuple":
            out.append((x, torch.full((size, 1), value), text))
        elif kind == "dict":
            ids = torch.full((size, 5), int(value), dtype=torch.long)
            out.append({"input_ids": ids, "x": x, "text": text, "meta": {"id": SECRET}})
        else:
            out.append([{"x": x}, {"text": text, "label": SECRET}])
    return out


def _features(batch: Any) -> torch.Tensor:
    """The (n, 8) float tensor wherever the loader put it (it turns tuples into lists)."""
    if isinstance(batch, torch.Tensor):
        return (
            batch
            if batch.dim() == 2 and batch.shape[1] == 8 and batch.is_floating_point()
            else None
        )  # type: ignore[return-value]
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, list) else ()
    for item in items:
        found = _features(item)
        if found is not None:
            return found
    return None  # type: ignore[return-value]


@given(data=batches())
def test_batch_contents_never_become_attributes(data: list[Any]) -> None:
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def body() -> None:
        for batch in loader:
            loss = model(_features(batch)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    tel = InMemoryTelemetry()
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, **providers(tel), console="off",
        trace_steps="all",
    )  # fmt: skip
    try:
        body()
    finally:
        otel_train.shutdown()
    assert [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    distinctive = {7777.25, -31337.5, 424242.0, 7777, -31337}
    for key, value in attribute_values(tel):
        text = str(value)
        assert SECRET not in text, key
        assert not any(f"{v:g}" in text for v in distinctive if isinstance(value, str)), key
        assert isinstance(value, (bool, str)) or value not in distinctive, key


# -- configuration -------------------------------------------------------------------------

NAMES = Settings.names()
FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def resolve_or_config_error(overrides: dict[str, Any], environ: dict[str, str]) -> Any:
    try:
        return Settings.resolve(overrides, environ)
    except ConfigError as err:
        return err


@given(name=st.sampled_from(NAMES), value=anything)
def test_any_keyword_value_resolves_or_names_the_setting(name: str, value: Any) -> None:
    result = resolve_or_config_error({name: value}, {})
    if isinstance(result, ConfigError):
        assert f"'{name}'" in str(result) and f"argument {name}=" in str(result)
        assert len(str(result)) < 1000  # one clear line, the value shown shortened
    else:
        assert isinstance(result, Settings)


env_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=40,
)
env_values = st.one_of(
    env_text, st.from_regex(r"\A-?[0-9]{1,30}(\.[0-9]*)?([eE][+-]?[0-9]{1,4})?\Z"),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "true", "off", "10-12", "3-1", " 5 "]),
)  # fmt: skip


# (setting, variable): every OTEL_TRAIN_* one and the standard OTEL_* ones we read.
VARIABLES = (
    [(n, ENV_PREFIX + n.upper()) for n in NAMES]
    + [(f.name, f.metadata["std_env"]) for f in FIELDS.values() if f.metadata.get("std_env")]
    + [("metric_export_interval", "OTEL_METRIC_EXPORT_INTERVAL")]
)


@given(setting=st.sampled_from(VARIABLES), value=env_values)
def test_any_environment_value_resolves_or_names_the_variable(
    setting: tuple[str, str], value: str
) -> None:
    name, variable = setting
    result = resolve_or_config_error({}, {variable: value})
    if isinstance(result, ConfigError):
        assert f"'{name}'" in str(result) and variable in str(result)
    else:
        assert isinstance(result, Settings)


@given(name=st.sampled_from(NAMES), value=anything)
def test_rejected_values_fail_at_instrument_before_anything_is_attached(
    name: str, value: Any
) -> None:
    if not isinstance(resolve_or_config_error({name: value}, {}), ConfigError):
        return  # accepted values are exercised by the tests that run sessions
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError) as raised:
        otel_train.instrument(model, optimizer=opt, **{name: value})
    assert f"'{name}'" in str(raised.value)
    assert not attached(model) and not opt._optimizer_step_pre_hooks
    assert otel_train.session.current() is None


@given(name=st.sampled_from(NAMES), value=st.one_of(anything, env_values))
def test_accepted_values_start_a_session_or_fail_with_config_error(name: str, value: Any) -> None:
    """A value the parser accepts may still be impossible here (a port in use, CUDA
    absent): that too is one ConfigError at instrument(), never another exception."""
    if isinstance(resolve_or_config_error({name: value}, {}), ConfigError):
        return
    quiet = {"console": "off", "prometheus_port": 0, "shutdown_timeout": 0.5}
    settings = {k: v for k, v in quiet.items() if k != name} | {name: value}
    model = torch.nn.Linear(2, 2)
    try:
        inst = otel_train.instrument(model, **settings)
    except ConfigError as err:
        assert f"'{name}'" in str(err)
        assert not attached(model) and otel_train.session.current() is None
        return
    try:
        assert inst.active and attached(model)
        model(torch.randn(1, 2))
    finally:
        assert otel_train.shutdown(0.5) in (True, False)


class Loop:
    """An RL-loop-shaped target for phases= maps."""

    def rollout(self) -> int:
        return 1

    def train(self) -> int:
        return 2


method_names = st.sampled_from(["rollout", "train", "missing", ""])
phase_maps = st.one_of(
    anything,
    st.dictionaries(
        st.one_of(st.text(max_size=200), st.integers()),
        st.one_of(method_names, st.lists(method_names, max_size=3), anything),
        max_size=3,
    ),
    st.lists(st.one_of(method_names, anything), max_size=3),
)


@given(phases=phase_maps, step=st.one_of(st.none(), method_names, anything))
def test_any_phase_map_is_attached_or_refused_clearly(phases: Any, step: Any) -> None:
    loop = Loop()
    before = dict(vars(loop))
    tel = InMemoryTelemetry()
    try:
        otel_train.instrument(loop, phases=phases, step=step, **providers(tel), console="off")
    except (ConfigError, TypeError) as err:
        assert str(err).startswith("otel_train.instrument()"), err
        assert vars(loop) == before  # nothing patched
        return
    try:
        assert loop.rollout() == 1 and loop.train() == 2  # results pass through
    finally:
        otel_train.shutdown()
    assert vars(loop) == before  # shutdown restored the instance exactly

"""The consumer in the sidecar, as a session drives it (wiring.Consumer): the feeder
hands the finished steps on; the sidecar consumes them and exports them with
otel-train's own SDK, or sends back what the application's SDK providers need (the
relay: relay_in.py). Its start raises SidecarUnavailable when the process cannot start
(the session then consumes on a thread: Session._start_consumer).

Usage (what the session does)::

    consumer = SidecarConsumer(settings, source, efficiency, regions, version, record,
                               relay=(tracer_provider, meter_provider), logger_provider=None)
    consumer.flush(timeout_s); consumer.end(deadline, drain_until)
"""

from __future__ import annotations

from typing import Any

from ..export.endpoint import bind_metrics_socket
from ..export.exporters import check_exporters, exports_traces
from ..export.logs import application_logger_provider
from ..export.resource import metrics_port
from ..export.setup import Telemetry
from ..processing.efficiency import EfficiencyTracker
from ..processing.source import StepSource
from ..recording.device import now_offset_ns
from ..recording.regions import RegionLog
from ..settings import Settings
from .feeder import PUMP_ENTRIES, PUMP_STEPS, Feeder


class SidecarConsumer:
    """``relay``: the application's (tracer, meter) providers, served from the sidecar;
    None: the sidecar builds otel-train's own SDK. ``record``: the run record's plan."""

    where = "sidecar"
    worker = None  # (no consumer thread in this process)

    def __init__(
        self,
        settings: Settings,
        source: StepSource,
        efficiency: EfficiencyTracker,
        regions: RegionLog,
        version: str,
        record: Any,
        relay: tuple[Any, Any] | None,
        logger_provider: Any,
    ) -> None:
        check_exporters(settings)  # a bad exporter setting fails here, not in the sidecar
        self.settings, self.record = settings, record
        self.recorder = source.recorder
        port = metrics_port(settings) if settings.prometheus and relay is None else None
        sock = None
        self.prometheus_address: tuple[str, int] | None = None
        if port is not None:
            sock = bind_metrics_socket(settings.prometheus_host, port, settings.prometheus_ranks)
            self.prometheus_address = sock.getsockname()[:2]
        app = None if relay is None else (*relay, application_logger_provider(logger_provider))
        self.feeder = Feeder(source, efficiency, regions, settings, version, now_offset_ns(),
                             sock, record, app)  # fmt: skip
        if relay is not None:  # the application's providers, fed here by the relay
            self.telemetry = Telemetry(*relay, None)
        else:  # what the sidecar builds, as seen from here (its providers live there)
            self.telemetry = Telemetry(None, None, None, owned=True)
        self.recorder.on_backlog(self.feeder.pump, PUMP_ENTRIES, PUMP_STEPS)

    @property
    def exports_traces(self) -> bool:
        if self.feeder.relay is None:  # the sidecar's own: OTLP, or the run record
            return exports_traces(self.settings) or self.record is not None
        return self.telemetry.tracer_provider is not None

    @property
    def takes_carriers(self) -> bool:
        return self.exports_traces and self.settings.trace_steps != "none"

    def start(self) -> None:
        pass  # (it runs since it answered)

    def pump(self) -> None:
        self.feeder.pump()

    def trace_first_from(self, index: int) -> None:
        self.feeder.trace_first_from(index)

    def note_model(self) -> None:
        self.feeder.note_model()

    def flush(self, timeout_s: float) -> bool:
        return bool(self.feeder.flush(timeout_s))

    def end(self, deadline: float, drain_until: float) -> bool:
        in_time = self.feeder.close(deadline, drain_until)  # drain, summary, flush there
        self.recorder.enabled = False
        return bool(in_time)

    def export_drops(self) -> dict[str, int]:
        return dict(self.feeder.stats.get("export_drops", {}))  # (as of the last flush)

    def forget(self) -> None:
        self.feeder.forget()  # the parent's pipe: a forked child never writes to it

"""The sidecar process (``python -m otel_train.sidecar``): otel-train's heavy work in a
process of its own. Everything in this folder runs in that process; its training
process's end (the feeder, the raw hand-over, the child process and pipes, the relay's
receiver) is ``otel_train/handover/``, and what crosses between them is
``handover/wire.py``.

When otel-train configures the SDK itself (no providers passed, none installed
globally), or the application's providers are the SDK's (passed, or installed globally
as ``opentelemetry-instrument`` does: relay.py serves them from here), each training
process starts one sidecar and hands it its log through the shared-memory ring and a
pipe. The sidecar runs the worker (metrics, console, sampling, efficiency figures), and
with otel-train's own SDK its span and metric pipelines, the OTLP exporters and
``/metrics``; with the application's, relay.py sends back finished spans, metric values
and hang records. Why: docs/rationale.md, "Where the work runs". Providers that are
not the SDK's, and the setting ``sidecar='off'``, keep all of it on a thread of the
training process instead.

- agent.py: the process: the pipe, the SDK, the worker;
- replica.py: its source of finished steps: a replica recorder applying the ring;
- relay.py: the application's own providers served from here.
"""

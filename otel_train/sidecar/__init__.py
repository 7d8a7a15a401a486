"""The sidecar: otel-train's heavy work in a process of its own.

When otel-train configures the SDK itself (no providers passed, none installed
globally), or the application's providers are the SDK's (passed, or installed globally
as ``opentelemetry-instrument`` does: relay.py serves them from here), each training
process starts one sidecar (``python -m otel_train.sidecar``) and hands it finished
steps through a pipe. The training process keeps the recorder
(the hot path, the step state machine, CUDA events, the FLOP probe); the sidecar runs
the worker (metrics, console, sampling, efficiency figures), and with otel-train's own
SDK its span and metric pipelines, the OTLP exporters and ``/metrics`` (with the
application's, relay.py sends back finished spans, metric values and hang records,
which relay_in.py hands over). Why: docs/rationale.md, "Where the work runs".
Providers that are not the SDK's, and the setting ``sidecar='off'``, keep all of it on
a thread of the training process instead.

- feeder.py: the training process's end (pumps on the training thread when its log or
  ring asks, and on a small thread of its own that tells how far the ring is written);
  relay_in.py: what the sidecar sends back for the application's own providers, handed
  to them a span at a time on a thread of its own;
- raw.py: the raw hand-over's sessions: the hooks write the shared-memory ring
  (recording/ring.py), and the training process catches up from it when asked;
- process.py: the sidecar's process and the pipes to it;
- agent.py: the sidecar process (replica.py: its source of finished steps, applying the
  ring; relay.py: the application's own providers served from here; handback.py: the
  console's text handed back);
- wire.py: the messages between them.
"""

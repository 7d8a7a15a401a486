"""The sidecar: otel-train's heavy work in a process of its own.

When otel-train configures the SDK itself (no providers passed, none installed
globally), each training process starts one sidecar (``python -m otel_train.sidecar``)
and hands it finished steps through a pipe. The training process keeps the recorder
(the hot path, the step state machine, CUDA events, the FLOP probe); the sidecar runs
the worker (metrics, console, sampling, efficiency figures), the SDK's span and metric
pipelines, the OTLP exporters and ``/metrics``. Why: docs/rationale.md, "Where the
work runs". The setting ``sidecar='off'`` keeps all of it on a thread of the training
process instead.

- feeder.py: the training process's end (no thread: pumps run on the training thread);
- agent.py: the sidecar process;
- wire.py: the messages between them.
"""

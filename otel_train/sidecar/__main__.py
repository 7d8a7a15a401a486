"""``python -m otel_train.sidecar``: started by the training process, never by hand."""

from .agent import main

main()

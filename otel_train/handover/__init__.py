"""The training process's end of the sidecar: code that runs in the training process,
on the threads named below, and hands the log over to the sidecar process
(``otel_train/sidecar/``, a process of its own).

- consumer.py: the sidecar as the session's consumer (wiring.Consumer), over the feeder;
- feeder.py: the hand-over, on the training thread when its log or ring asks and on the
  ``otel-train-feeder`` thread every 100 ms (the ring's news, the sidecar's requests);
- raw.py: the raw hand-over's sessions: the hooks write the shared-memory ring
  (recording/ring.py), and the training process catches up from it when asked;
- process.py: the sidecar's child process and the pipes to it (any thread adds a frame,
  the feeder's lock holder writes);
- handback.py: the console's text the sidecar hands back, printed here;
- relay_in.py: the ``otel-train-relay`` thread: what the sidecar made for the
  application's own providers, handed to them a span at a time;
- wire.py: the messages between the two processes, imported by both ends (the one
  module here that the sidecar also runs).
"""

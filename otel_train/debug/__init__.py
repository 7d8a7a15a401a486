"""Debugging components you can pull into any training loop, with or without otel-train.

- :class:`~otel_train.debug.profiler_window.ProfilerWindow`: ``torch.profiler`` over a
  chosen range of steps, its trace written to a directory and linked from those steps'
  spans.
- :class:`~otel_train.debug.memory_snapshot.MemorySnapshot`: CUDA allocator history
  recorded over a window of steps or armed for out-of-memory errors; the snapshot is
  dumped and its path attached to the failing span before the error reaches you.

Each module imports only torch and the OpenTelemetry API (a test loads them on their
own, without the rest of otel-train); the rank in their file names is passed in.
``instrument()`` switches them on from the ``profile_steps``, ``memory_snapshot`` and
``debug_dir`` settings.
"""

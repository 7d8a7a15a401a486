"""Debugging components you can pull into any training loop, with or without otel-train.

- :class:`~otel_train.debug.profiler_window.ProfilerWindow`: ``torch.profiler`` over a
  chosen range of steps, its trace written to a directory and linked from those steps'
  spans.
- :class:`~otel_train.debug.memory_snapshot.MemorySnapshot`: CUDA allocator history
  recorded over a window of steps or armed for out-of-memory errors; the snapshot is
  dumped and its path attached to the failing span before the error reaches you.

Each module imports only torch, the OpenTelemetry API and ``otel_train/identity.py``
(standard library only, for the rank in file names; loaded by its path when a module
is loaded on its own, as a test does, without the rest of otel-train).
``instrument()`` switches them on from the ``profile_steps``, ``memory_snapshot`` and
``debug_dir`` settings.
"""

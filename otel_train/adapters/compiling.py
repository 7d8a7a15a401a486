"""Whether Dynamo is tracing the caller: hooks and wrappers of ours pass straight through
then, so that a compiled frame is what it would be without otel-train.

A clock read, a recorder call or a C++ method of a process group (a collective's sequence
number) inside a traced function is a graph break, or an error under ``fullgraph=True``.
Dynamo traces :func:`dynamo_compiling` as the constant True, so the branch that skips the
telemetry is the only one in the graph; called eagerly it is ~20 ns.

Usage::

    if dynamo_compiling():
        return original(*args, **kwargs)
"""

from __future__ import annotations

import torch

# (torch.compiler.is_compiling() is the older name, ~100 ns eagerly)
dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)

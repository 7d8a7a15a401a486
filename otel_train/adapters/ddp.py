"""DDP's gradient all-reduce, told from backward's own work.

``DistributedDataParallel`` all-reduces gradients from C++ (its reducer), bucket by bucket
while backward runs, and waits for the last buckets when backward's autograd work is done:
that wait is where a rank meets its slowest peer, and no Python call brackets it. So the
plain-loop adapter watches one parameter, the first of the wrapped module: DDP puts it in
its last bucket and its gradient is ready last (``register_post_accumulate_grad_hook``, one
call per backward). From that moment to the end of backward the training thread waits
for the all-reduce: a ``ddp_all_reduce`` collective's phase inside ``backward``
(recording/collectives.py), and what a hang record names meanwhile. Backwards under
``no_sync()`` (gradient accumulation) all-reduce nothing and get none.

On CUDA with NCCL the host does not wait there (the compute stream does, device-side): the
phase is timed on the device, from an event the last gradient's hook records on its
thread's stream to backward's end, which the stream reaches once the all-reduce is done.
"""

from __future__ import annotations

from functools import partial
from time import perf_counter_ns
from typing import Any

import torch

from ..recording.collectives import DDP_OP, group_name
from .base import Instrumentation


def watch_ddp(inst: Instrumentation, adapter: Any, model: Any) -> None:
    """If ``model`` is a DDP module, time its gradient wait for ``adapter`` (which gets
    ``ddp_group`` and ``ddp_grad_ns``, and as ``backward_ends`` what backward.py calls
    before backward's end)."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is None or not isinstance(model, ddp):
        return
    param = next((p for p in model.module.parameters() if p.requires_grad), None)
    if param is None or not hasattr(param, "register_post_accumulate_grad_hook"):
        return
    adapter.ddp_group = group_name(getattr(model, "process_group", None))
    rec = adapter.rec

    def last_gradient(_: Any) -> None:
        # (on the autograd engine's thread: stores only)
        if model.require_backward_grad_sync and adapter.active:
            t = adapter.ddp_grad_ns = perf_counter_ns()
            rec.collective_now = (DDP_OP, adapter.ddp_group, None, t)
            rec.events.release(adapter.ddp_grad_event)  # (one not waited for: back)
            adapter.ddp_grad_event = rec.device_event()  # (this thread's stream)

    handle = param.register_post_accumulate_grad_hook(last_gradient)
    inst.on_undo(handle.remove)
    adapter.backward_ends = partial(ddp_backward_ends, adapter)


def ddp_backward_ends(adapter: Any) -> None:
    """Backward is about to end: the wait since the last gradient, as DDP's collective."""
    t0 = adapter.ddp_grad_ns
    if t0:
        adapter.ddp_grad_ns = 0
        ev0, adapter.ddp_grad_event = adapter.ddp_grad_event, None
        rec = adapter.rec
        rec.collective_now = None
        rec.waited(DDP_OP, adapter.ddp_group, t0, perf_counter_ns(), ev0)

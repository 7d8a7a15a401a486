"""Instructions per call of each plain-loop hook, in a raw session's ring, under callgrind.

``instructions.py`` counts the training thread's whole share per step; this splits it by
hook, so that what the 20,000-instruction target asks of each is a figure, not a guess.
Each hook is called ``--calls`` times in a loop of its own, with the hooks writing the
shared-memory ring as in a sidecar's raw session (handover/raw.py), against the same loop
calling what the hook wraps without it:

- the DataLoader iterator's ``next()`` (a data phase: two ring slots, the batch counted)
  against a plain iterator's;
- the model's timed ``forward`` (one slot) against the function it wraps, a no-op;
- the ``torch.autograd.backward`` wrapper (two slots) against a no-op with its arguments;
- the optimizer's step pre- and post-hook (one slot each) against an empty loop.

The wrapped work is a no-op, so the figures are the hooks' own: the Python frames,
torch's calls in the batch counting and the C writer. Two rounds; the smaller count of
each is printed (a round can only add: a collection, a dict resize).

Usage: python benchmarks/hook_instructions.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from instructions import marker, totals


def inner(calls: int, out: str) -> None:
    import overhead as ob
    import torch

    import otel_train
    from otel_train import session
    from otel_train.adapters import backward, torch_loop
    from otel_train.export.setup import in_memory_meter_provider
    from otel_train.handover.raw import RawHandover
    from otel_train.recording.ring import Ring

    torch.set_num_threads(1)
    model, opt, loader = ob.make_job(64, 8, 64)
    mp, _ = in_memory_meter_provider()
    otel_train.configure(tracer_provider=ob.sdk_tracer_provider(), meter_provider=mp,
                         console="off")  # fmt: skip
    sess = session.current()
    assert sess is not None
    worker, rec = sess.worker, sess.recorder
    worker._stop.set()  # (its process() runs here, between the loops)
    worker._thread.join()
    otel_train.instrument(model, optimizer=opt, dataloader=loader)
    ob.plain_steps(model, opt, loader, 100)  # (past the FLOP count: the log may defer)
    while rec.has_work():
        worker.process()
    rec.settle()
    handover = RawHandover(rec, lambda message: None, Ring(rec), lambda: False)
    with rec._lock:
        handover._wait = 0
        handover.try_enter()
    assert handover.raw, "a raw session opens between steps"
    adapter = model.forward.adapter
    batch = (torch.randn(8, 784), torch.randint(0, 10, (8,)))
    batches = [batch] * calls

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    timed_forward = torch_loop._TimedForward(adapter, model, noop)
    backward._ORIGINAL_BACKWARD = noop  # (the wrapper's original: nothing to differentiate)
    loss = torch.zeros(())

    def plain_next() -> None:
        it = iter(batches)
        for _ in range(calls):
            next(it)

    def timed_next() -> None:
        timed_iter = torch_loop._TimedIterator(iter(batches), adapter)
        for _ in range(calls):
            next(timed_iter)

    def plain_forward() -> None:
        for _ in range(calls):
            noop(batch)

    def timed() -> None:
        for _ in range(calls):
            timed_forward(batch)

    def plain_backward() -> None:
        for _ in range(calls):
            noop(loss, None, None, False, inputs=None)

    def timed_backward() -> None:
        for _ in range(calls):
            backward._patched_backward(loss, None, None, False, inputs=None)

    def empty() -> None:
        for _ in range(calls):
            pass

    def optimizer_hooks() -> None:
        for _ in range(calls):
            adapter.optimizer_pre_hook(opt, (), {})
            adapter.optimizer_post_hook(opt, (), {})

    loops = [plain_next, timed_next, plain_forward, timed, plain_backward, timed_backward,
             empty, optimizer_hooks]  # fmt: skip
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   capture_output=True)  # fmt: skip
    time.sleep(0.3)
    order = []
    for _ in range(2):
        for loop in loops:
            gc.collect()
            marker()
            loop()
            marker()
            order.append(loop.__name__)
    Path(out).write_text(json.dumps(order))
    os._exit(0)  # (the ring session is not left: nothing after this is measured)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per loop")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args.calls, args.inner)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out, order_file = Path(tmp) / "cg.out", Path(tmp) / "order.json"
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        "--dump-before=getppid", f"--callgrind-out-file={out}", "-q",
                        sys.executable, __file__, "--inner", str(order_file), "--calls",
                        str(args.calls)], check=True)  # fmt: skip
        order = json.loads(order_file.read_text())
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        per: dict[str, float] = {}
        for i, name in enumerate(order):  # dump 1: before the first marker; then pairs
            ir = totals(dumps[1 + 2 * i]) / args.calls
            per[name] = min(per.get(name, ir), ir)
    rows = [("DataLoader next(): data phase, batch counted", "timed_next", "plain_next"),
            ("forward wrapper", "timed", "plain_forward"),
            ("backward wrapper", "timed_backward", "plain_backward"),
            ("optimizer pre- and post-hook", "optimizer_hooks", "empty")]  # fmt: skip
    print(f"{'hook (per call, ring session)':<48}{'instructions':>14}")
    total = 0.0
    for label, hook, base in rows:
        d = per[hook] - per[base]
        total += d
        print(f"{label:<48}{d:>14.0f}")
    print(f"{'one plain-loop step (one call of each)':<48}{total:>14.0f}")


if __name__ == "__main__":
    main()

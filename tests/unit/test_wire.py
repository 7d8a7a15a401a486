"""What crosses the sidecar's pipe (handover/wire.py): blocks of recognised steps and
their shapes cross as themselves, and come out with the columns they went in with."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train.handover import wire
from otel_train.processing.blocks import StepBlock
from otel_train.testing import InMemoryTelemetry

COLUMNS = ("first", "k", "starts", "ends", "seconds", "durations", "phase_seconds",
           "samples", "tokens", "padded", "scalars")  # fmt: skip


def _blocks(epochs: int) -> list[StepBlock]:
    """Blocks of a real loop's recognised steps, as the training process takes them."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          flops_per_step=1.0e6, sidecar="off", **providers(tel))  # fmt: skip
    sess = otel_train.session.current()
    assert sess is not None and sess.recorder._defer
    sess.worker._stop.set()
    sess.worker._thread.join(5)
    try:
        for _ in range(epochs):
            train_epoch(model, opt, loader, record=True)
        return [StepBlock.of_run(run) for _, run in sess.recorder.drain_blocks()]
    finally:
        otel_train.shutdown()


def _columns(block: StepBlock) -> dict[str, Any]:
    block.columns()
    return {name: getattr(block, name) for name in COLUMNS}


def test_a_block_crosses_as_itself_and_its_shape_once() -> None:
    blocks = _blocks(epochs=6)
    assert len(blocks) >= 2 and len({id(b.template) for b in blocks}) == 1
    writer, reader = wire.FrameWriter(), wire.FrameReader()
    frames = [writer.frame((wire.DELIVERY, [b])) for b in blocks]
    got = [m[1][0] for f in frames for m in reader.feed(f)]
    assert [_columns(b) for b in got] == [_columns(b) for b in blocks]
    assert all(isinstance(b, StepBlock) and b.template is got[0].template for b in got)
    assert len(reader.templates) == 1  # the shape was sent whole once, by key after
    tpl, sent = got[0].template, blocks[0].template
    assert (tpl.kinds, tpl.rows, tpl.start, tpl.end, tpl.counts, tpl.scalars, tpl.loose) == (
        sent.kinds,
        sent.rows,
        sent.start,
        sent.end,
        sent.counts,
        sent.scalars,
        sent.loose,
    )
    assert len(frames[1]) < len(frames[0])


def test_each_pipe_sends_a_shape_whole_the_first_time() -> None:
    """A shape is known by key only to the reader its writer sent it to: a new pipe (a
    restarted sidecar) gets it whole again."""
    (block, *_) = _blocks(epochs=2)
    first, second = wire.FrameWriter(), wire.FrameWriter()
    first.frame((wire.DELIVERY, [block]))
    (message,) = wire.FrameReader().feed(second.frame((wire.DELIVERY, [block])))
    assert _columns(message[1][0]) == _columns(block)


def test_a_frame_that_fails_leaves_its_shapes_unsent() -> None:
    """A message that cannot be pickled makes no frame, and a shape it carried is sent
    whole with the next frame that carries it."""
    (block, *_) = _blocks(epochs=2)
    writer, reader = wire.FrameWriter(), wire.FrameReader()
    with pytest.raises((pickle.PicklingError, TypeError, AttributeError)):
        writer.frame((wire.DELIVERY, [block], lambda: None))
    (message,) = reader.feed(writer.frame((wire.DELIVERY, [block])))
    assert _columns(message[1][0]) == _columns(block)

"""The sidecar hands each step to its worker once (sidecar/replica.py): the indices handed
on are kept as merged ranges, and steps may come in any order."""

from __future__ import annotations

from otel_train.sidecar.replica import IndexRanges


def test_ranges_merge_and_answer_for_exactly_what_was_added() -> None:
    seen = IndexRanges()
    seen.add(6, 39)
    assert seen.has(6, 25) and seen.has(39, 39)
    assert not seen.has(0, 6) and not seen.has(39, 40)
    for i in (0, 1, 3, 4):  # (out of order, with a gap at 2)
        seen.add(i, i)
    assert not seen.has(2, 2) and seen.has(3, 4)
    seen.add(2, 2)
    seen.add(5, 5)
    assert (seen.starts, seen.ends) == ([0], [39])

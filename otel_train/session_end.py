"""A session's flush and its end, each bounded: what reaches the providers, in which
order, within which deadline. session.py's Session delegates here; ``session`` is that
Session, typed Any (session.py imports this module: an annotation back would be a cycle).

Usage (what Session.flush and Session.shutdown do)::

    flush(session, timeout_s)      # True if everything finished so far was exported in time
    shutdown(session, timeout_s)   # uninstrument, drain, print the summary, flush; bounded
"""

from __future__ import annotations

import time
from typing import Any


def flush(session: Any, timeout_s: float) -> bool:
    """Every step finished so far reaches the providers: metrics current, spans
    exported (bounded by ``timeout_s``); True if all of it was done in time."""
    if session.closed:
        return True
    session.start_exports()
    consumer = session.consumer  # (None: its exports failed to start)
    return consumer is not None and bool(consumer.flush(timeout_s))


def shutdown(session: Any, timeout_s: float | None = None) -> bool:
    """Uninstrument everything, drain, print the summary, flush exports; bounded."""
    if session.closed:
        return True
    session.start_exports()  # (a bare-call session's held exports: what it holds leaves)
    session.closed = True
    if session.sigterm is not None:
        session.sigterm.uninstall()
    budget = session.settings.shutdown_timeout if timeout_s is None else max(0.0, timeout_s)
    deadline = time.monotonic() + budget
    rec = session.recorder
    # A batch fetched but never trained on (nanoGPT fetches the next one at the end
    # of each iteration) opened a step that holds only its fetch: it is no step.
    rec.discard_step_if_only("data")
    for inst in list(session.instrumentations.values()):
        inst.uninstrument()
    if rec.current_step is not None and rec.enabled:
        rec.end_step(rec.current_step.mode)
    rec.end_background()
    if session.efficiency.probe is not None:
        session.efficiency.probe.abort()  # a count still running (a step never ended)
    if rec.debug is not None:
        rec.debug.close()  # a profiler window cut short still writes its trace
    consumer = session.consumer
    if consumer is None:  # (its exports failed to start)
        return False
    # Half the budget for draining, the rest for the summary and the exporters.
    ok = consumer.end(deadline, time.monotonic() + budget / 2)
    session.write_run_facts()  # (beside the record, now complete)
    return bool(ok)

"""A model's own subclass, so that its forward is timed with nothing stored on it.

The plain-loop adapter's timed forward (torch_loop._timed_forward) must not live on the
instance: an instance attribute, or a hook in the module's hook dicts, is pickled with a
whole-model ``torch.save`` (which then fails to load with ``weights_only=True`` or where
otel-train is not installed) and copied by ``copy.deepcopy``. So :func:`time_forward`
makes the model's class a subclass made for that one model, whose ``forward`` is the
timed one, and which pickles and copies as the model's class (docs/rationale.md).

Usage (what torch_loop.attach does)::

    undo = time_forward(model, timed)   # timed(module, *args, **kwargs)
    ...
    undo()                              # the model's class again
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import types
from collections.abc import Callable
from typing import Any

_log = logging.getLogger("otel_train")

_SET_CLASS = object.__dict__["__class__"].__set__  # (what ``obj.__class__ = c`` does)


def _timed_class(cls: type, timed: Any) -> type:
    """A subclass of ``cls`` for one model, ``timed`` its ``forward``, named as ``cls``.
    Its instances say ``cls`` is their ``__class__`` and reduce as instances of ``cls``
    (pickle checks the one against the other), so whole-model saves are byte for byte
    those made without otel-train (they load with ``weights_only=True`` where otel-train
    is not installed), and deep copies are of ``cls``. ``type()`` tells the truth."""

    reduce_ex: Any = cls.__reduce_ex__  # (the class's own, or object's)

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = reduce_ex(self, protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 2:
            return reduced
        args = tuple(cls if a is sub else a for a in reduced[1])
        return (reduced[0], args, *reduced[2:])

    def body(ns: dict[str, Any]) -> None:
        ns.update(forward=timed, __reduce_ex__=__reduce_ex__, __module__=cls.__module__,
                  __qualname__=cls.__qualname__,
                  __class__=property(lambda self: cls, _SET_CLASS))  # fmt: skip

    sub = types.new_class(cls.__name__, (cls,), exec_body=body)
    return sub


class _InstanceForward(functools.partial):  # type: ignore[type-arg]
    """``timed`` bound to the model, as the instance's ``forward`` (called in C: no Python
    frame of its own). A copied or pickled model gets the forward this one replaced, not
    the timing: the copy (an EMA model, say) is not instrumented. A bound method is
    copied onto the copy."""

    __wrapped__: Any  # the forward it replaced (inspect.signature follows it)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.__wrapped__, memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (copy.copy, (self.__wrapped__,))  # (a function is its own copy)


def time_forward(model: Any, timed: Any) -> Callable[[], None]:
    """Make ``timed`` (a function of the model and the call's arguments) the model's
    forward; returns the undo. The model's class becomes its own subclass (nothing is
    stored on the instance), unless the instance has a forward of its own (a compiled
    module's, a user's wrapper): then that is wrapped in place."""
    prior = model.__dict__.get("forward")
    cls = type(model)
    if prior is None and isinstance(inspect.getattr_static(cls, "forward"), types.FunctionType):
        try:
            sub = _timed_class(cls, timed)
            _SET_CLASS(model, sub)
        except Exception:  # (a class that cannot be subclassed so: the instance's, then)
            _log.debug("otel-train: the model's class cannot be subclassed", exc_info=True)
        else:

            def restore_class() -> None:
                if type(model) is sub:  # (changed again since: stays, inert)
                    _SET_CLASS(model, cls)

            return restore_class
    wrapper = _InstanceForward(timed, model)
    wrapper.__wrapped__ = model.forward
    model.forward = wrapper

    def restore_forward() -> None:
        if model.__dict__.get("forward") is wrapper:  # (wrapped again since: stays, inert)
            if prior is None:
                del model.__dict__["forward"]
            else:
                model.__dict__["forward"] = prior

    return restore_forward

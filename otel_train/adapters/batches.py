"""How many samples and tokens a batch holds, read from shapes only.

Every adapter counts batches with :func:`batch_counts` unless ``instrument(...,
count_batch=fn)`` gives its own rule (:func:`user_counter`). Shapes only: a batch's
contents may sit on a device, and reading them there would synchronise with it.

Besides samples and tokens, a batch has *padded tokens*: the positions the model computes
on, padding included (``input_ids``' size where an attention mask says fewer are real).
Throughput counts tokens; FLOPs follow the padded shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_BOOL = torch.bool


Counts = tuple[int | None, int | None, int | None]  # (samples, tokens, padded tokens)


def count_batch(batch: Any) -> tuple[int | None, int | None]:
    """Samples and tokens of a batch, from shapes only (never from contents on a device).

    Samples: the first dimension of the first tensor found (the ``batch_dim`` setting's,
    through :func:`batch_counter`). Tokens: in a mapping, the
    sum of a CPU ``attention_mask`` when present, else the element count of
    ``input_ids``; otherwise the element count of the first tensor when it holds token
    ids (an integer tensor of two or more dimensions, such as nanoGPT's ``(x, y)``).
    """
    samples, tokens, _ = batch_counts(batch)
    return samples, tokens


def batch_counts(batch: Any) -> Counts:
    """:func:`count_batch`'s samples and tokens, and the padded tokens: ``input_ids``'
    element count in a mapping with an attention mask, else the tokens."""
    # Fast paths for the usual shapes: (x, y, ...) of tensors and {"input_ids": ...}.
    kind = type(batch)
    if kind is tuple or kind is list:
        if batch and isinstance(batch[0], torch.Tensor):
            return _with_padded(tensor_counts(batch[0]))
    elif kind is dict:
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim():
            size = int(ids.numel())
            mask = batch.get("attention_mask")
            if isinstance(mask, torch.Tensor) and not mask.is_cuda:
                return int(ids.shape[0]), int(mask.sum()), size
            return int(ids.shape[0]), size, size
    elif isinstance(batch, torch.Tensor):
        return _with_padded(tensor_counts(batch))
    t = _first_tensor(batch)
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
        samples = int(t.shape[0]) if t is not None and t.dim() > 0 else None
        tokens, padded = _mapping_tokens(batch)
        return samples, tokens, padded
    return _with_padded(tensor_counts(t)) if t is not None else (None, None, None)


def _with_padded(counts: tuple[int | None, int | None]) -> Counts:
    return counts[0], counts[1], counts[1]


def batch_counter(batch_dim: int) -> Callable[[Any], Counts]:
    """The default rule with samples read off dimension ``batch_dim`` (the setting) of the
    batch's first tensor: :func:`batch_counts` itself for 0."""
    if batch_dim == 0:
        return batch_counts

    def counts(batch: Any) -> Counts:
        _, tokens, padded = batch_counts(batch)
        t = _first_tensor(batch)
        samples = int(t.shape[batch_dim]) if t is not None and t.dim() > batch_dim else None
        return samples, tokens, padded

    return counts


def counting_note(batch_dim: int, user: bool) -> str:
    """The run summary's line saying how samples were counted."""
    if user:
        return "samples: as count_batch= counted them"
    layout = "sequence-first" if batch_dim else "batch-first; batch_dim=1 for sequence-first"
    return f"samples: dimension {batch_dim} of each batch's first tensor ({layout})"


def choose_counter(inst: Any, fn: Any) -> Callable[[Any], Counts]:
    """An adapter's rule: ``count_batch=fn``'s, else the default with the session's
    ``batch_dim``; the summary says which (recording/notes.py)."""
    session = inst.session
    batch_dim = session.settings.batch_dim
    session.notes.add(counting_note(batch_dim, fn is not None))
    return user_counter(fn) if fn is not None else batch_counter(batch_dim)


def user_counter(fn: Any) -> Any:
    """``instrument(count_batch=fn)``: ``fn(batch) -> (samples, tokens)``, tokens padded
    or not as ``fn`` counts them (its tokens key the FLOPs too)."""

    def counts(batch: Any) -> Counts:
        samples, tokens = fn(batch)
        return samples, tokens, tokens

    return counts


def tensor_counts(t: torch.Tensor) -> tuple[int | None, int | None]:
    """A batch's first tensor: its first dimension as samples, and its element count as
    tokens when it holds token ids (integers, two or more dimensions)."""
    dims = t.dim()
    if not dims:
        return None, None
    if dims >= 2 and not t.is_floating_point() and not t.is_complex() and t.dtype != _BOOL:
        return int(t.shape[0]), int(t.numel())
    return int(t.shape[0]), None


def _first_tensor(x: Any, depth: int = 0) -> Any:
    """The first tensor in a nested batch (at most 4 levels, 8 items a level)."""
    if isinstance(x, torch.Tensor):
        return x
    if depth > 3:
        return None
    if isinstance(x, dict) or (hasattr(x, "keys") and hasattr(x, "__getitem__")):
        for key in ("input_ids", "inputs", "x"):
            try:
                v = x[key]
            except (KeyError, TypeError, IndexError):
                continue
            if isinstance(v, torch.Tensor):
                return v
        try:
            values = list(x.values())[:8]
        except Exception:
            return None
        for v in values:
            t = _first_tensor(v, depth + 1)
            if t is not None:
                return t
        return None
    if isinstance(x, (list, tuple)):
        for v in x[:8]:
            t = _first_tensor(v, depth + 1)
            if t is not None:
                return t
    return None


def _mapping_tokens(batch: Any) -> tuple[int | None, int | None]:
    """Tokens of a mapping batch: a CPU attention mask's sum, else input_ids' size; and
    the padded tokens (input_ids' size, else the tokens). Mappings here need only
    keys/__getitem__ (BatchEncoding, UserDict), not .get."""
    try:
        ids = batch["input_ids"] if "input_ids" in batch else None  # noqa: SIM401
    except Exception:
        ids = None
    size = int(ids.numel()) if isinstance(ids, torch.Tensor) else None
    try:
        mask = batch["attention_mask"] if "attention_mask" in batch else None  # noqa: SIM401
    except Exception:
        mask = None
    if isinstance(mask, torch.Tensor) and not mask.is_cuda:
        tokens = int(mask.sum())
        return tokens, size if size is not None else tokens
    return size, size

"""What a FLOP count hands the efficiency figures: a count's result, the key a step's
FLOPs are known by, the label of a precision mix, and the trainable parameters the
estimate needs.

No torch here: the sidecar's efficiency figures read these (counts cross the pipe as
CountResult objects) and the sidecar never imports torch. The counting itself, with
torch's dispatch modes, is in flops.py, and the precision labels in precision.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MIXED = "mixed"  # several precisions, none dominant: no single peak fits (MFU is left out)

FlopKey = tuple[int | None, int | None]


def flop_key(samples: int | None, tokens: int | None, padded: int | None) -> FlopKey:
    """What a step's FLOPs are known by: its samples and the tokens the model computed
    on, padding included (``padded``, adapters/batches.py), else its tokens."""
    return samples, padded if padded is not None else tokens


@dataclass(frozen=True)
class CountResult:
    index: int  # the counted step
    samples: int | None
    tokens: int | None
    padded: int | None  # tokens padding included, when an adapter counted them
    flops: int
    dtype: str  # fp32 / tf32 / bf16 / fp16 / fp8 / mixed, from the matmuls' inputs ("": none)
    seconds: float  # host wall time of the counted step, counting included
    uncounted: tuple[str, ...] = ()  # attention operators that ran with no FLOP formula
    not_counted: str = ""  # why the step was not counted after all ("": it was)

    @property
    def key(self) -> FlopKey:
        return flop_key(self.samples, self.tokens, self.padded)


def parameter_count(models: Iterable[Any]) -> int:
    """Trainable parameters of the given modules, each parameter counted once."""
    seen: set[int] = set()
    total = 0
    for model in models:
        params = getattr(model, "parameters", None)
        if params is None:
            continue
        for p in params():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total

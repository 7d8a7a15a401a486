"""MFU of a GPT-2-small-sized step in bf16 on the GPU, next to torch.profiler's FLOPs.

Prints the figures (scripts/gpu-check keeps the log): counted FLOPs per step, the
analytic count, the profiler's FLOP estimate for the same step, device step time,
achieved TFLOP/s and MFU against the datasheet peak of the device. Checks that the
counted FLOPs match the analytic count within 5%, that the profiler's estimate is
not above ours (it counts matmuls only, not attention), and that MFU is a share.
"""

from __future__ import annotations

import time

import pytest
import torch

import otel_train
from otel_train import contract as c
from otel_train.processing.peaks import lookup_peak
from otel_train.testing import InMemoryTelemetry

pytestmark = pytest.mark.gpu

LAYERS, D, HEADS, T, BATCH, VOCAB = 12, 768, 12, 1024, 8, 50257


def _analytic() -> int:
    per_layer = 24 * T * D * D + 4 * T * T * D  # qkv, proj, mlp; scores and values
    return 3 * BATCH * (LAYERS * per_layer + 2 * T * D * VOCAB)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.up, self.down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class _GPT2Small(torch.nn.Module):
    """GPT-2 small's shapes in plain torch (the GPU machine has no transformers)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(T, D)
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpt2_small_bf16_mfu_next_to_the_profiler() -> None:
    torch.cuda.init()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = _GPT2Small().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, VOCAB, (BATCH, T), device=dev)

    def one() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, trace_steps="all", console="off",
                          tracer_provider=tel.tracer_provider,
                          meter_provider=tel.meter_provider)  # fmt: skip
    for _ in range(8):
        with otel_train.step(samples=BATCH, tokens=BATCH * T):
            one()
    torch.cuda.synchronize()
    time.sleep(0.3)
    otel_train.shutdown()
    steps = sorted((dict(s.attributes) for s in tel.spans() if s.name == c.STEP_SPAN.name),
                   key=lambda a: a[c.STEP_INDEX.key])  # fmt: skip

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA],
                                with_flops=True) as prof:  # fmt: skip
        one()
        torch.cuda.synchronize()
    profiler_flops = sum(e.flops for e in prof.key_averages() if e.flops)

    name = torch.cuda.get_device_name()
    peak = lookup_peak(name, "bf16")
    counted = steps[-1][c.STEP_FLOPS.key]
    late = steps[3:]
    device_s = sorted(a[c.STEP_DEVICE_DURATION.key] for a in late)[len(late) // 2]
    mfus = [a[c.STEP_MFU.key] for a in late if c.STEP_MFU.key in a]
    counted_step = next(a for a in steps if a.get(c.STEP_FLOPS_COUNTED.key))
    print(f"\n{name}: GPT-2 small {LAYERS}x{D}, seq {T}, batch {BATCH}, bf16 autocast")
    print(
        f"  counted FLOPs/step {counted:.4e}  analytic {_analytic():.4e}  "
        f"torch.profiler {profiler_flops:.4e} (matmuls only)"
    )
    print(
        f"  median device step {device_s * 1e3:.2f} ms  achieved "
        f"{counted / device_s / 1e12:.1f} TFLOP/s"
    )
    if peak is not None:
        print(
            f"  MFU (ours) {100 * counted / device_s / peak.flops_per_s:.1f}%  "
            f"MFU (profiler FLOPs) {100 * profiler_flops / device_s / peak.flops_per_s:.1f}%"
            f"  peak {peak.flops_per_s / 1e12:.1f} TFLOP/s ({peak.device}, {peak.source})"
        )
    print(f"  per-step MFU attribute: {[round(100 * m, 1) for m in mfus]}")
    print(
        f"  counting step {counted_step[c.STEP_HOST_DURATION.key] * 1e3:.1f} ms host, "
        f"source {counted_step[c.STEP_FLOPS_SOURCE.key]}"
    )
    assert counted == pytest.approx(_analytic(), rel=0.05)
    assert profiler_flops <= counted * 1.05
    if peak is not None:
        assert mfus and all(0 < m < 1 for m in mfus)

"""What counting FLOPs costs: the counted step next to the steps around it.

Runs an instrumented loop on a small GPT-2 (CPU) or a GPT-2-small-sized one in bf16
(CUDA), counts FLOPs at step 1 as by default, and prints per step: host time, whether
it was counted, FLOPs, achieved TFLOP/s and MFU. Then the counting step's extra time
and the mean step time after it, which is what every later step pays (nothing extra:
the recorder holds no probe once the shape is counted).

    python benchmarks/flops_cost.py            # CPU: 4 layers, d=256, seq 128, batch 4
    python benchmarks/flops_cost.py --small    # GPT-2 small (12 x 768, seq 1024, batch 8)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def best_of(n: int, model: Any, opt: Any, vocab: int, batch: int, t: int, device: Any,
            dtype: Any) -> None:  # fmt: skip
    """Best-of-n wall time of a plain step and of a step under the FLOP counter (no
    otel-train session: the two differ only by the counting)."""
    from otel_train.processing.flops import count_flops

    ids = torch.randint(0, vocab, (batch, t), device=device)

    def one() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    plain, counted = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        one()
        plain.append(time.perf_counter() - t0)
        counted.append(count_flops(one)[2])
    print(f"best of {n}: plain step {min(plain) * 1e3:.1f} ms, counted step "
          f"{min(counted) * 1e3:.1f} ms (+{(min(counted) - min(plain)) * 1e3:.1f} ms, "
          f"{min(counted) / min(plain):.2f}x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="GPT-2 small sizes")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="also time N plain and N counted steps of the model, best of each",
    )
    args = ap.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    cuda = torch.cuda.is_available()
    small = args.small or cuda
    layers, d, heads, t, batch = (12, 768, 12, 1024, 8) if small else (4, 256, 4, 128, 4)
    vocab = 50257 if small else 1024
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.cuda.init()
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=t, vocab_size=vocab,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, trace_steps="all", console="off",
                          tracer_provider=tel.tracer_provider,
                          meter_provider=tel.meter_provider)  # fmt: skip
    dtype = torch.bfloat16 if cuda else torch.float32
    for _ in range(args.steps):
        ids = torch.randint(0, vocab, (batch, t), device=device)
        with otel_train.step(samples=batch, tokens=batch * t):
            with torch.autocast(device.type, dtype=dtype, enabled=cuda):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    time.sleep(0.2)
    otel_train.shutdown()
    if args.repeat:
        best_of(args.repeat, model, opt, vocab, batch, t, device, dtype)
    steps = sorted(
        (dict(s.attributes) for s in tel.spans() if s.name == c.STEP_SPAN.name),
        key=lambda a: a[c.STEP_INDEX.key],
    )
    print(f"GPT-2 {layers}x{d}, seq {t}, batch {batch}, {device.type} {dtype}")
    print(f"{'step':>4} {'host ms':>9} {'device ms':>10} {'counted':>8} {'GFLOP':>10} "
          f"{'TFLOP/s':>8} {'MFU':>7}")  # fmt: skip
    for a in steps:
        dev = a.get(c.STEP_DEVICE_DURATION.key)
        flops = a.get(c.STEP_FLOPS.key)
        rate = a.get(c.STEP_THROUGHPUT_FLOPS.key)
        mfu = a.get(c.STEP_MFU.key)
        print(
            f"{a[c.STEP_INDEX.key]:>4} {a[c.STEP_HOST_DURATION.key] * 1e3:>9.1f} "
            f"{'-' if dev is None else f'{dev * 1e3:.1f}':>10} "
            f"{'yes' if a.get(c.STEP_FLOPS_COUNTED.key) else '':>8} "
            f"{'-' if flops is None else f'{flops / 1e9:,.1f}':>10} "
            f"{'-' if rate is None else f'{rate / 1e12:.3f}':>8} "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%':>7}"
        )
    counted = [a for a in steps if a.get(c.STEP_FLOPS_COUNTED.key)]
    after = [a[c.STEP_HOST_DURATION.key] for a in steps[3:]]
    if counted and after:
        first, typical = counted[0][c.STEP_HOST_DURATION.key], statistics.median(after)
        print(f"counting step {first * 1e3:.1f} ms; median later step {typical * 1e3:.1f} ms; "
              f"counting cost {(first - typical) * 1e3:.1f} ms "
              f"({first / typical:.1f}x a step)")  # fmt: skip
    analytic = 3 * batch * (layers * (24 * t * d * d + 4 * t * t * d) + 2 * t * d * vocab)
    if steps and c.STEP_FLOPS.key in steps[-1]:
        print(f"counted {steps[-1][c.STEP_FLOPS.key]:.4g} FLOPs/step, analytic {analytic:.4g} "
              f"(ratio {steps[-1][c.STEP_FLOPS.key] / analytic:.4f})")  # fmt: skip


if __name__ == "__main__":
    main()

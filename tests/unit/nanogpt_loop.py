"""A loop shaped like karpathy/nanoGPT's ``train.py`` on a tiny GPT, with synthetic tokens:
``get_batch`` slices random windows of a token tensor (no DataLoader) and the next
micro-batch is fetched between forward and backward; gradient accumulation divides the
loss by the micro-steps; ``GradScaler`` scales, unscales for clipping, steps and updates;
an evaluation under ``torch.no_grad()`` in eval mode runs every few iterations; and the
model's ``estimate_mfu`` FLOP formula, 6N + 12*L*H*Q*T per token (PaLM's appendix B), is
what nanoGPT prints its MFU from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class Config:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    batch_size: int = 4
    accum: int = 2  # gradient_accumulation_steps
    max_iters: int = 6  # iterations 0..max_iters, as train.py's `iter_num > max_iters`
    eval_interval: int = 3
    eval_iters: int = 2
    grad_clip: float = 1.0


class Block(torch.nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1 = torch.nn.LayerNorm(cfg.n_embd)
        self.c_attn = torch.nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = torch.nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = torch.nn.LayerNorm(cfg.n_embd)
        d = cfg.n_embd
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in self.c_attn(x).split(d, dim=2))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (flash attention)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = torch.nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = torch.nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = torch.nn.LayerNorm(cfg.n_embd)
        self.lm_head = torch.nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def num_params(self) -> int:
        """``get_num_params(non_embedding=True)``: the position embeddings left out (the
        token embeddings are the head's weights, so they stay)."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def flops_per_iter(self, fwdbwd_per_iter: int) -> int:
        """``estimate_mfu``'s numerator: FLOPs of one iteration by the formula."""
        cfg = self.cfg
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_token = 6 * self.num_params() + 12 * L * H * Q * T
        return flops_per_token * T * fwdbwd_per_iter


def get_batch(data: torch.Tensor, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - cfg.block_size, (cfg.batch_size,))
    x = torch.stack([data[i : i + cfg.block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + cfg.block_size] for i in ix])
    return x, y


def train(
    cfg: Config, scaler_enabled: bool, instrument: Callable[[GPT, Any], Any] | None = None
) -> tuple[GPT, int]:
    """train.py's loop from a fixed seed: the model and the iterations run.
    ``instrument(model, optimizer)`` is called once both are made."""
    torch.manual_seed(1337)
    data = {split: torch.randint(0, cfg.vocab_size, (2000,)) for split in ("train", "val")}
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cpu", enabled=scaler_enabled)  # (fp16 only, in nanoGPT)
    if instrument is not None:
        instrument(model, optimizer)

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = [model(*get_batch(data[split], cfg))[1].item() for _ in range(cfg.eval_iters)]
            out[split] = sum(losses) / len(losses)
        model.train()
        return out

    iter_num = 0
    x, y = get_batch(data["train"], cfg)  # the first batch, fetched before the loop
    while True:
        if iter_num % cfg.eval_interval == 0:
            estimate_loss()
        for _ in range(cfg.accum):
            _, loss = model(x, y)
            loss = loss / cfg.accum  # scaled to account for gradient accumulation
            x, y = get_batch(data["train"], cfg)  # fetched while the forward runs (async on GPU)
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the logged loss
        iter_num += 1
        if iter_num > cfg.max_iters:
            return model, iter_num

"""Tokens per second of a small GPT on the simulated device against the CPU, with and without fused attention.

Measures, in one process with the same model, data and optimizer, in
``--rounds`` rounds over all configurations (medians reported):

- a training step (forward, cross-entropy, backward, AdamW step,
  ``loss.item()``): tokens per second, median over the timed steps;
- greedy generation (no KV cache: each new token reruns the causal model on
  the context so far): generated tokens per second;

each on the CPU and on the simulated device, with PyTorch's default
attention backend (on the device: the plugin's fused kernel through the
overrideable route; on the CPU: PyTorch's flash-attention CPU kernel) and
with ``sdpa_kernel(SDPBackend.MATH)`` (the composite math path everywhere).
It also reports which operators fell back to the CPU on the device.

Run ``python benches/python/bench_attention.py`` (``--help`` for the model
size, batch, sequence length and step counts; ``--json`` for
machine-readable output). Figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_fl


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention through SDPA, then a GELU MLP.

    The causal mask is SDPA's ``is_causal=True``, or an explicit boolean
    ``mask`` (what scripts that predate ``is_causal`` do; it also keeps
    PyTorch's math path from building a mask with ``tril`` on every call).
    """

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final norm and an output head tied to the embedding."""

    def __init__(
        self, vocab: int, context: int, width: int, heads: int, layers: int, dropout: float, explicit_mask: bool
    ) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.explicit_mask = explicit_mask
        self.register_buffer("causal", torch.ones(context, context, dtype=torch.bool).tril(), persistent=False)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        # Position ids sliced from a buffer (no arange per call).
        self.register_buffer("position_ids", torch.arange(context), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(self.position_ids[:t])
        mask = self.causal[:t, :t] if self.explicit_mask else None
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def backend(fused: bool) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if fused else sdpa_kernel([SDPBackend.MATH])


def train_tokens_per_s(model: GPT, device: str, args: argparse.Namespace, fused: bool) -> float:
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g) for _ in range(4)]
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    with backend(fused):
        for i in range(args.warmup + args.steps):
            tokens = batches[i % len(batches)]
            start = time.perf_counter()
            tokens = tokens.to(device)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()  # waits for the device
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    return args.batch * args.seq / statistics.median(times)


@torch.no_grad()
def generate_tokens_per_s(model: GPT, device: str, args: argparse.Namespace, fused: bool) -> float:
    model = model.to(device).eval()
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    times = []
    with backend(fused):
        for i in range(args.warmup + args.runs):
            start = time.perf_counter()
            idx = prompt.to(device)
            for _ in range(args.new_tokens):
                logits = model(idx[:, -args.seq :])
                idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            idx.cpu()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    return args.new_tokens / statistics.median(times)


@contextlib.contextmanager
def counting_fallbacks(record: dict[str, int]) -> Iterator[None]:
    torch_fl.reset_fallback_stats()
    yield
    for op, n in torch_fl.fallback_stats().items():
        record[op] = record.get(op, 0) + n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128, help="training sequence length (and context)")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of every configuration")
    parser.add_argument(
        "--causal",
        choices=["flag", "mask"],
        default="flag",
        help="is_causal=True (default) or an explicit boolean mask",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for PyTorch's CPU kernels and the simulator's kernels (0: their defaults)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    if args.threads:
        # Before the plugin is loaded: rayon and matrixmultiply read these
        # when they first start threads.
        os.environ["RAYON_NUM_THREADS"] = os.environ["MATMUL_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    torch_fl.register_device_plugin(name="sim")
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.width, args.heads, args.layers, args.dropout, args.causal == "mask")
    configs = [(device, fused) for device in ("cpu", "sim") for fused in (True, False)]
    samples: dict[str, dict[str, list[float]]] = {}
    fallbacks: dict[str, int] = {}
    # Rounds over all configurations, medians over rounds: load on a shared
    # machine drifts, and this spreads it over every configuration alike.
    for _ in range(args.rounds):
        for device, fused in configs:
            label = f"{device} {'fused' if fused else 'math'}"
            record = samples.setdefault(label, {"train_tokens_per_s": [], "generate_tokens_per_s": []})
            with counting_fallbacks(fallbacks) if device == "sim" else contextlib.nullcontext():
                record["train_tokens_per_s"].append(train_tokens_per_s(copy.deepcopy(model), device, args, fused))
                record["generate_tokens_per_s"].append(generate_tokens_per_s(copy.deepcopy(model), device, args, fused))
    results = {label: {k: statistics.median(v) for k, v in r.items()} for label, r in samples.items()}
    if args.json:
        print(json.dumps({"config": vars(args), "results": results, "sim_fallbacks": fallbacks}, indent=2))
        return
    print(
        f"GPT: {args.layers} layers, width {args.width}, {args.heads} heads, vocab {args.vocab}; "
        f"training batch {args.batch} x {args.seq} tokens; generation {args.new_tokens} tokens "
        f"after a {args.prompt}-token prompt; causal mask: {args.causal}; threads: {args.threads or 'default'}"
    )
    print(f"{'':12} {'train tok/s':>12} {'generate tok/s':>15}")
    for label, r in results.items():
        print(f"{label:12} {r['train_tokens_per_s']:12.0f} {r['generate_tokens_per_s']:15.1f}")
    print(f"sim CPU fallbacks: {sum(fallbacks.values())} calls {sorted(fallbacks)}")


if __name__ == "__main__":
    main()

"""Small language models in plain ``torch.nn``, and the loops that generate with them.

These are the architectures people train and sample from, reduced to their
operators: a GPT-2-style decoder (tied embeddings, a causal mask built with
``tril`` on the device), a Llama-style decoder (RMSNorm, rotary position
embeddings computed on the device with ``sin``/``cos``, SwiGLU, grouped-query
attention through :func:`torch.nn.functional.scaled_dot_product_attention`
with ``is_causal`` and ``enable_gqa``) and a BERT-style encoder (padding
masks, masked-language-model data prepared on the device). The generation
loops cover greedy decoding, sampling with temperature, top-k (``topk``) and
top-p (``sort`` + ``cumsum`` + ``scatter``) through ``multinomial``, stopping
at end-of-sequence tokens (``isin``), and beam search (``topk`` over
flattened scores, ``//`` and ``%`` to split them, advanced indexing to
reorder beams). :class:`StaticDecoder` decodes a GPT one token at a time
with a preallocated KV cache and no host reads, the shape device graphs
capture.

The demo (``python -m torch_fl.demo --model gpt``), the coverage report of
:func:`torch_fl.test_compatibility` and the test suite use them; they need
nothing beyond PyTorch and run on any device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "Bert", "Llama", "StaticDecoder", "beam_search", "generate", "mlm_batch", "token_logprobs"]


class _CausalSelfAttention(nn.Module):
    """GPT-2 attention written out: scores, a ``tril`` mask, softmax, dropout."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        scores = scores.masked_fill(~causal, float("-inf"))
        y = self.drop(F.softmax(scores, dim=-1)) @ v
        out: torch.Tensor = self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return out


class _GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """A GPT-2-style decoder: learned positions, pre-norm blocks, output projection tied to the embedding."""

    def __init__(
        self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, context: int = 16, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_GPTBlock(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, time, vocab]`` for ``tokens`` ``[batch, time]``."""
        positions = torch.arange(tokens.shape[1], dtype=torch.long, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def _rotary(length: int, head_dim: int, device: torch.device, theta: float = 10000.0) -> tuple[torch.Tensor, ...]:
    """Llama's rotary tables, computed on ``device``: ``cos`` and ``sin`` of ``[length, head_dim]``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim))
    t = torch.arange(length, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _LlamaBlock(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.norm1, self.norm2 = _RMSNorm(width), _RMSNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


class Llama(nn.Module):
    """A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention."""

    def __init__(
        self, vocab: int = 64, width: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2, context: int = 16
    ) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_LlamaBlock(width, heads, kv_heads, 2 * width) for _ in range(layers))
        self.norm = _RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, time, vocab]`` for ``tokens`` ``[batch, time]``."""
        first = self.blocks[0]
        assert isinstance(first, _LlamaBlock)
        cos, sin = _rotary(tokens.shape[1], first.head_dim, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


class _BertLayer(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.ffn = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        x = self.ln1(x + F.dropout(self.out(y.transpose(1, 2).reshape(b, t, c)), p, self.training))
        out: torch.Tensor = self.ln2(x + F.dropout(self.ffn(x), p, self.training))
        return out


class Bert(nn.Module):
    """A BERT-style encoder with a masked-language-model head; padding tokens are masked out of attention."""

    def __init__(
        self,
        vocab: int = 64,
        width: int = 32,
        heads: int = 4,
        layers: int = 2,
        context: int = 16,
        pad_id: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.tokens = nn.Embedding(vocab, width, padding_idx=pad_id)
        self.positions = nn.Embedding(context, width)
        self.segments = nn.Embedding(2, width)
        self.ln = nn.LayerNorm(width)
        self.layers = nn.ModuleList(_BertLayer(width, heads, 2 * width, dropout) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """MLM logits ``[batch, time, vocab]``; positions holding ``pad_id`` are not attended to."""
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).unsqueeze(0).expand(b, t)
        if segments is None:
            segments = torch.zeros_like(tokens)
        x = self.ln(self.tokens(tokens) + self.positions(positions) + self.segments(segments))
        keep = (tokens != self.pad_id)[:, None, None, :]  # [batch, 1, 1, time]: attend to real tokens only
        for layer in self.layers:
            x = layer(x, keep)
        logits: torch.Tensor = self.head(x)
        return logits


def _filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering: removed entries become ``-inf``."""
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1)
        remove = cumulative > top_p
        remove[:, 1:] = remove[:, :-1].clone()  # keep the first token past the threshold
        remove[:, 0] = False
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return logits


@torch.no_grad()
def generate(
    model: nn.Module,
    tokens: torch.Tensor,
    steps: int,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    context: int = 16,
) -> torch.Tensor:
    """Extend ``tokens`` ``[batch, time]`` by up to ``steps`` tokens.

    Greedy decoding takes the ``argmax``; sampling divides the last logits by
    ``temperature``, filters them (``top_k``, ``top_p``) and draws with
    ``multinomial`` from ``generator``. Rows that produced one of ``eos_ids``
    keep producing their first EOS id; the loop stops once every row has.
    """
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(steps):
        logits = model(tokens[:, -context:])[:, -1, :]
        if greedy:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = F.softmax(_filter_logits(logits / temperature, top_k, top_p), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        if eos_ids is not None:
            nxt = torch.where(finished[:, None], eos_ids[:1].expand_as(nxt), nxt)
            finished = finished | torch.isin(nxt[:, 0], eos_ids)
        tokens = torch.cat([tokens, nxt], dim=1)
        if eos_ids is not None and bool(finished.all()):
            break
    return tokens


class StaticDecoder:
    """Greedy decoding of a :class:`GPT`, one token per :meth:`step`, on static tensors: what a device graph captures.

    Keys and values go into a cache preallocated for the model's whole
    context (``[layers, batch, heads, context, head_dim]``); the position is
    a device tensor, written by masks rather than indexing, so a step has
    fixed shapes and never reads a value on the host. ``token`` holds the
    input of the next step, and a step leaves its greedy choice there, so
    steps chain without the host; ``position`` counts the tokens consumed.
    The tokens equal :func:`generate`'s greedy ones while the sequence fits
    the context.

    Example::

        decoder = StaticDecoder(model, batch=1)
        decoder.start(prompt)  # prefill, one step per prompt token
        tokens = [decoder.step().clone() for _ in range(8)]
    """

    def __init__(self, model: GPT, batch: int = 1) -> None:
        self.model = model
        device = model.wte.weight.device
        first = model.blocks[0]
        assert isinstance(first, _GPTBlock)
        self.heads = first.attn.heads
        width = model.wte.weight.shape[1]
        shape = (len(model.blocks), batch, self.heads, model.context, width // self.heads)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self._slots = torch.arange(model.context, device=device)

    @torch.no_grad()
    def start(self, prompt: torch.Tensor) -> torch.Tensor:
        """Resets the cache and feeds ``prompt`` ``[batch, time]``; returns the first generated token."""
        self.position.zero_()
        for i in range(prompt.shape[1]):
            self.token.copy_(prompt[:, i : i + 1])
            self.step()
        return self.token

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Consumes ``token`` at ``position``; leaves the next greedy token in ``token`` and returns it."""
        m = self.model
        b = self.token.shape[0]
        here = (self._slots == self.position)[:, None]  # [context, 1]: the slot this token fills
        seen = (self._slots <= self.position).reshape(1, 1, 1, -1)
        x = m.wte(self.token) + m.wpe(self.position)
        for layer, block in enumerate(m.blocks):
            assert isinstance(block, _GPTBlock)
            attn = block.attn
            c = x.shape[-1]
            q, k, v = (
                z.view(b, 1, self.heads, c // self.heads).transpose(1, 2)
                for z in attn.qkv(block.ln1(x)).split(c, dim=2)
            )
            self.keys[layer].copy_(torch.where(here, k, self.keys[layer]))
            self.values[layer].copy_(torch.where(here, v, self.values[layer]))
            scores = (q @ self.keys[layer].transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            y = F.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1) @ self.values[layer]
            x = x + attn.proj(y.transpose(1, 2).reshape(b, 1, c))
            x = x + block.mlp(block.ln2(x))
        logits = m.head(m.ln_f(x))[:, -1, :]
        self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.position.add_(1)
        return self.token


@torch.no_grad()
def beam_search(
    model: nn.Module, tokens: torch.Tensor, steps: int, beams: int = 3, context: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search: the ``beams`` best continuations of each row and their summed log-probabilities."""
    batch = tokens.shape[0]
    seqs = tokens.repeat_interleave(beams, dim=0)
    scores = torch.zeros(batch, beams, device=tokens.device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one
    for _ in range(steps):
        logp = F.log_softmax(model(seqs[:, -context:])[:, -1, :], dim=-1)
        vocab = logp.shape[-1]
        candidates = (scores.reshape(-1, 1) + logp).reshape(batch, beams * vocab)
        scores, flat = torch.topk(candidates, beams, dim=1)
        source = flat // vocab  # which beam each candidate extends
        token = flat % vocab
        rows = (torch.arange(batch, device=tokens.device)[:, None] * beams + source).reshape(-1)
        seqs = torch.cat([seqs[rows], token.reshape(-1, 1)], dim=1)
    return seqs.reshape(batch, beams, -1), scores


def token_logprobs(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each next token of ``tokens`` under ``model`` (``gather``), ``[batch, time - 1]``."""
    logp = F.log_softmax(model(tokens[:, :-1]), dim=-1)
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def mlm_batch(
    tokens: torch.Tensor,
    vocab: int,
    mask_id: int = 2,
    special_ids: tuple[int, ...] = (0, 1, 2),
    p: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM corruption on ``tokens``' device: ``(inputs, labels)``, labels -100 where not predicted.

    Of the non-special tokens, a fraction ``p`` is chosen; of those 80% become
    ``mask_id``, 10% a random token and 10% stay.
    """
    special = torch.tensor(special_ids, device=tokens.device)
    u = torch.rand(tokens.shape, device=tokens.device, generator=generator)
    chosen = (u < p) & ~torch.isin(tokens, special)
    labels = tokens.masked_fill(~chosen, -100)
    random_tokens = torch.randint(len(special_ids), vocab, tokens.shape, device=tokens.device, generator=generator)
    inputs = torch.where(chosen & (u < 0.8 * p), torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(chosen & (u >= 0.8 * p) & (u < 0.9 * p), random_tokens, inputs)
    return inputs, labels

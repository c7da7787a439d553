"""The language models of the coverage report: GPT, Llama and BERT training steps, and a generation loop.

Each entry is ``(label, make model, make input)`` like the other coverage
models; the model wraps a :mod:`torch_fl.lm` architecture so that one call
is the whole workload: a training step's loss (cross-entropy with ignored
labels, differentiated by the coverage run) or a generation loop (greedy
decoding, top-k and top-p sampling, beam search; not differentiable, so
forward only). The generation wrapper returns the greedy and beam-search
tokens, which the device must reproduce exactly; sampled tokens come from
the device's own random stream and are left out of the comparison.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import lm

__all__ = ["lm_models"]

_VOCAB, _IGNORE, _PAD = 64, -100, 0


class _LanguageModelLoss(nn.Module):
    """Next-token (decoders) or masked-token (BERT) cross-entropy; padding positions are ignored."""

    def __init__(self, model: nn.Module, causal: bool) -> None:
        super().__init__()
        self.model, self.causal = model, causal

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.causal:
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
        else:
            inputs, labels = tokens, tokens
        labels = labels.masked_fill(labels == _PAD, _IGNORE)
        logits = self.model(inputs)
        return F.cross_entropy(logits.reshape(-1, _VOCAB), labels.reshape(-1), ignore_index=_IGNORE)


class _Generation(nn.Module):
    """Greedy decoding, top-k/top-p sampling with an end-of-sequence id, and beam search with one model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        greedy = lm.generate(self.model, prompt, 4, greedy=True)
        eos = torch.tensor([1, 2], device=prompt.device)
        lm.generate(self.model, prompt, 4, temperature=0.8, top_k=8, top_p=0.9, eos_ids=eos)
        beams, _ = lm.beam_search(self.model, prompt, 3, beams=2)
        return torch.cat([greedy.flatten(), beams.flatten()])


def _tokens() -> torch.Tensor:
    t = torch.randint(3, _VOCAB, (2, 12))
    t[0, -3:] = _PAD
    return t


def lm_models() -> list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor]]]:
    """The coverage entries: GPT, Llama and BERT training steps and a generation loop."""
    return [
        (
            "GPT (2 layers, width 32, tied embeddings, tril mask; loss+backward)",
            lambda: _LanguageModelLoss(lm.GPT(vocab=_VOCAB), causal=True),
            _tokens,
        ),
        (
            "Llama (2 layers, width 32, RoPE, SwiGLU, GQA via SDPA; loss+backward)",
            lambda: _LanguageModelLoss(lm.Llama(vocab=_VOCAB), causal=True),
            _tokens,
        ),
        (
            "BERT (2 layers, width 32, padding mask; masked-LM loss+backward)",
            lambda: _LanguageModelLoss(lm.Bert(vocab=_VOCAB, pad_id=_PAD), causal=False),
            _tokens,
        ),
        (
            "GPT generation (greedy, top-k/top-p sampling, EOS, beam search)",
            lambda: _Generation(lm.GPT(vocab=_VOCAB).eval()),
            lambda: torch.randint(3, _VOCAB, (2, 4)),
        ),
    ]

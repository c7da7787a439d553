"""The eval fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``, composed on the device.

In eval mode (or under ``torch.no_grad()``) both modules skip their Python
code and call one fused operator, ``_native_multi_head_attention`` and
``_transformer_encoder_layer_fwd``, for PrivateUse1 devices as for CUDA (their
``why_not_sparsity_fast_path`` checks list the custom device by name). PyTorch
implements those operators for the CPU and CUDA only, so on a plugin device
they would go through the CPU fallback: every weight and activation copied to
the host and back, per layer and call.

These kernels compute the same results from operators the plugin serves: the
projections with ``linear``, the attention with
``F.scaled_dot_product_attention`` (so the plugin's fused attention kernel
runs when it offers one, see docs/design/privateuse1-notes.md, "Fused
attention"), or, when the caller wants the attention weights, with an
explicit softmax; then layer norms, the feed-forward block and the residuals
in the fast path's order. A plugin that implements either operator itself
wins: :mod:`torch_fl.composites` installs these only for operators no plugin
serves.

``nn.TransformerEncoder`` in eval with a padding mask goes further on CUDA: it
packs the batch into a nested tensor (``_nested_tensor_from_mask``), which
plugin devices do not support. The left-alignment check before it runs on the
device here, and the packing raises an error that names the way out
(``enable_nested_tensor=False``) instead of failing later on a nested tensor
of the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import torch
import torch.nn.functional as F


def _keep_mask(mask: torch.Tensor, mask_type: int | None, batch: int) -> torch.Tensor:
    """Where to attend (``True``), broadcastable to ``(B, H, L, S)``, from a fast-path mask.

    Fast-path masks mark what to *ignore*: booleans, or the additive float
    masks ``nn.MultiheadAttention`` makes of them (``-inf`` where ignored),
    which the CPU kernel reads as "nonzero is masked". Type 1 is a key
    padding mask ``(B, S)``, type 0 an attention mask ``(L, S)``, type 2 a
    merged ``(B, H, L, S)`` one.
    """
    masked = mask if mask.dtype == torch.bool else mask.to(torch.bool)
    if mask_type == 1:
        masked = masked.view(batch, 1, 1, masked.shape[-1])
    return masked.logical_not()


def native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``aten::_native_multi_head_attention`` for batch-first ``(B, L, E)`` inputs."""
    if query.is_nested or key.is_nested or value.is_nested:
        raise NotImplementedError(
            "torch-fl: _native_multi_head_attention does not take nested tensors on a plugin device"
        )
    batch, target, source = query.shape[0], query.shape[1], key.shape[1]
    head_dim = embed_dim // num_head
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)
    q = F.linear(query, w_q, b_q).view(batch, target, num_head, head_dim).transpose(1, 2)
    k = F.linear(key, w_k, b_k).view(batch, source, num_head, head_dim).transpose(1, 2)
    v = F.linear(value, w_v, b_v).view(batch, source, num_head, head_dim).transpose(1, 2)
    keep = None if mask is None else _keep_mask(mask, mask_type, batch)
    weights: torch.Tensor | None = None
    if need_weights:
        scores = (q * head_dim**-0.5) @ k.transpose(-2, -1)
        if keep is not None:
            scores = scores.masked_fill(keep.logical_not(), float("-inf"))
        weights = torch.softmax(scores, -1)
        if keep is not None:
            # A row with nothing to attend to gets zeros, as the CPU kernel's
            # masked softmax gives (softmax alone would give NaN).
            weights = weights.masked_fill(keep.logical_not().all(-1, keepdim=True), 0.0)
        context = weights @ v
        if average_attn_weights:
            weights = weights.mean(1)
    else:
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    out = F.linear(context.transpose(1, 2).reshape(batch, target, embed_dim), proj_weight, proj_bias)
    return out, weights


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    """``aten::_transformer_encoder_layer_fwd``: one encoder layer, pre- or post-norm."""
    if src.is_nested:
        raise NotImplementedError(
            "torch-fl: _transformer_encoder_layer_fwd does not take nested tensors on a plugin device"
        )
    if src.numel() == 0:
        return src.clone()
    shape = (embed_dim,)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    # Through the dispatcher: a plugin's own kernel for it wins.
    x = torch._native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
    )[0]
    x = x + src
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    x = F.linear(x, ffn_weight_1, ffn_bias_1)
    x = F.gelu(x) if use_gelu else F.relu(x)
    x = F.linear(x, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x


def nested_tensor_from_mask_left_aligned(t: torch.Tensor, mask: torch.Tensor) -> bool:
    """``aten::_nested_tensor_from_mask_left_aligned``: every row of ``mask`` is ones, then zeros."""
    if t.dim() != 3 or mask.dim() != 2 or mask.shape != t.shape[:2]:
        raise RuntimeError(
            f"expected a 3-D tensor and a 2-D mask of its first two sizes, got {t.shape} and {mask.shape}"
        )
    keep = mask if mask.dtype == torch.bool else mask.to(torch.bool)
    return not bool((keep[:, 1:] & keep[:, :-1].logical_not()).any())


def nested_tensor_from_mask(t: torch.Tensor, mask: torch.Tensor, mask_check: bool = True) -> NoReturn:
    """``aten::_nested_tensor_from_mask``: refused with the remedy (plugin devices have no nested tensors)."""
    raise NotImplementedError(
        f"torch-fl: nested tensors are not supported on the '{t.device.type}' device. nn.TransformerEncoder packs "
        "padded batches into one in eval mode: construct it with enable_nested_tensor=False."
    )


KERNELS: dict[str, Callable[..., object]] = {
    "_native_multi_head_attention": native_multi_head_attention,
    "_transformer_encoder_layer_fwd": transformer_encoder_layer_fwd,
    "_nested_tensor_from_mask_left_aligned": nested_tensor_from_mask_left_aligned,
    "_nested_tensor_from_mask": nested_tensor_from_mask,
}

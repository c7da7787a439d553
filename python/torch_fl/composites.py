"""Device kernels torch-fl builds from other operators, for operators the CPU fallback cannot serve.

The CPU fallback runs an operator's CPU kernel; a few operators PyTorch
dispatches on custom devices have none, because PyTorch only implements them
for CUDA. ``nn.LSTM`` is the one that matters: on any device but the CPU it
calls the fused cell ``_thnn_fused_lstm_cell`` (and its backward), so without
a kernel here LSTMs could not run on a plugin device at all. These kernels
compose the cell from elementwise operators, which the plugin serves (or which
fall back one by one). A plugin that implements the fused cell itself wins:
its kernel is registered for the operator and these are not installed.

``index_fill_`` is composed from ``index_put_`` on the device: torch 2.15
routes ``x[index] = scalar`` to it, which would otherwise take the CPU
fallback (a round trip per assignment).

The eval fast paths of ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` have CPU kernels, but through the fallback
they would copy every layer's weights to the host and back on every call:
:mod:`torch_fl.fastpaths` composes them on the device, installed the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _native, fastpaths

# Leaked on purpose: destroying the Library would unregister the kernels.
_library: torch.library.Library | None = None


def _fused_lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    # The workspace holds the activated gates, as CUDA's kernel stores them.
    return hy, cy, torch.cat([i, f, g, o], 1)


def _fused_lstm_cell_backward_impl(
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    cx: torch.Tensor,
    cy: torch.Tensor,
    workspace: torch.Tensor,
    has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    grad_o = torch.zeros_like(o)
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy * o * (1 - o)
    grad_i = grad_c * g * i * (1 - i)
    grad_f = grad_c * cx * f * (1 - f)
    grad_g = grad_c * i * (1 - g * g)
    grad_gates = torch.cat([grad_i, grad_f, grad_g, grad_o], 1)
    grad_cx = grad_c * f
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_cx, grad_bias


def _index_fill_(self: torch.Tensor, dim: int, index: torch.Tensor, value: object) -> torch.Tensor:
    # torch 2.15 routes `x[index] = scalar` (one index tensor) to index_fill_,
    # which a plugin rarely has; index_put_ does the same on the device.
    fill = (
        value.to(self.device, self.dtype)
        if isinstance(value, torch.Tensor)
        else torch.full((), value, dtype=self.dtype, device=self.device)  # type: ignore[call-overload]
    )
    if self.dim() == 0:
        return self.copy_(fill) if index.numel() else self
    dim = dim + self.dim() if dim < 0 else dim
    index = index.to(self.device)
    indices: list[torch.Tensor | None] = [None] * dim + [index]
    # The values as advanced indexing lays them out (kernels need not broadcast).
    shape = (*self.shape[:dim], *index.shape, *self.shape[dim + 1 :])
    out: torch.Tensor = torch.ops.aten.index_put_(self, indices, fill.expand(shape).contiguous())
    return out


_KERNELS: dict[str, Callable[..., object]] = {
    "_thnn_fused_lstm_cell": _fused_lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": _fused_lstm_cell_backward_impl,
    "index_fill_.int_Scalar": _index_fill_,
    "index_fill_.int_Tensor": _index_fill_,
    **fastpaths.KERNELS,
}


def install() -> list[str]:
    """Registers the composites the device's plugins do not implement; returns their names."""
    global _library
    served = _native.served_ops()
    missing = [name for name in _KERNELS if name not in served]
    if not missing:
        return []
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
    for name in missing:
        _library.impl(name, _KERNELS[name], "PrivateUse1")
    return missing

"""CUDA's autocast policy for torchvision's detection operators, on the plugin device.

Under ``torch.autocast("cuda")`` torchvision runs ``nms`` and ``roi_align`` in
float32: its Autocast kernels cast their floating inputs up (and
``roi_align``'s result back to the input's dtype). It registers them for the
CUDA, CPU and XPU autocast keys only, so on a plugin device a detection model
under autocast would hand ``nms`` boxes and scores of different dtypes, which
it refuses. torch-fl registers the same policy for ``AutocastPrivateUse1`` when
torchvision is imported (before or after the device is registered), unless
torchvision already provides one.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

__all__ = ["install"]

# Leaked on purpose: destroying the Library would unregister the kernels.
_library: torch.library.Library | None = None

_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined] # not in torch's stubs


def _to_float(t: torch.Tensor) -> torch.Tensor:
    """Autocast's float32 cast: floating tensors other than float64 only."""
    return t.float() if t.is_floating_point() and t.dtype is not torch.float64 else t


def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
        return torch.ops.torchvision.nms(_to_float(dets), _to_float(scores), iou_threshold)


def _roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
        out = torch.ops.torchvision.roi_align(
            _to_float(input), _to_float(rois), spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
        )
    return out.to(input.dtype)


def install(torchvision: ModuleType) -> list[str]:
    """Registers the policy for the operators torchvision defines; returns their names.

    Called by torch-fl's import hook once ``torchvision`` is imported.
    """
    global _library
    extension = getattr(torchvision, "extension", None)
    if extension is None or not extension._has_ops():
        return []  # torchvision without its compiled operators
    installed = []
    for name, kernel in (("nms", _nms), ("roi_align", _roi_align)):
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"torchvision::{name}", "AutocastPrivateUse1"):
            continue
        if _library is None:
            _library = torch.library.Library("torchvision", "IMPL")
        _library.impl(name, kernel, "AutocastPrivateUse1")
        installed.append(f"torchvision::{name}")
    return installed

"""Device memory figures of the device module, in ``torch.cuda``'s names.

All of them go through PyTorch's ``torch.accelerator`` memory API, which
the C++ shim's allocator answers from the plugin.
"""

from __future__ import annotations

from typing import Any

import torch

from ._index import DeviceLike, device_index


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by tensors on ``device``."""
    return torch.accelerator.memory_allocated(device_index(device))


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` since the last reset."""
    return torch.accelerator.max_memory_allocated(device_index(device))


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes the plugin's allocator holds on ``device``."""
    return torch.accelerator.memory_reserved(device_index(device))


def memory_stats(device: DeviceLike = None) -> dict[str, Any]:
    """Allocator statistics of ``device``, in ``torch.cuda.memory_stats`` form."""
    return torch.accelerator.memory_stats(device_index(device))


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Resets the peaks reported by :func:`memory_stats`."""
    torch.accelerator.reset_peak_memory_stats(device_index(device))


def empty_cache() -> None:
    """Returns cached, unused device memory to the plugin."""
    torch.accelerator.empty_cache()


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``."""
    free, total = torch.accelerator.get_memory_info(device_index(device))
    return int(free), int(total)

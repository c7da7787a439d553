"""The device module PyTorch exposes as ``torch.<name>`` (``torch.sim``).

It offers the names users know from ``torch.cuda``. PyTorch itself calls
into it: ``torch.accelerator.is_available()`` and ``device_count()``
delegate here, ``torch.load`` validates devices with it, ``torch.autocast``
asks it for the supported dtypes, and ``torch.manual_seed`` seeds every
device through ``manual_seed_all``. Everything is implemented on PyTorch's
own accelerator API, which the C++ shim backs with the plugin, and on the
Rust core's record of the bound device, so this package holds no state of
its own. A process has one torch-fl device, so one module object serves it
whatever its name (the shape of PyTorch's OpenReg reference backend).

The concepts, one module each: device selection and synchronization here,
:mod:`.streams`, :mod:`.memory`, :mod:`.random`, :mod:`.amp`, and
:mod:`.initialization` (initialization state and fork safety).

Functions here must not call their ``torch.accelerator`` twins where those
delegate back to this module (``is_available``, ``device_count``): they use
the C++ hooks directly instead.
"""

from __future__ import annotations

import torch

from ._index import DeviceLike, current_device, device_index
from .amp import get_amp_supported_dtype
from .initialization import _is_in_bad_fork as _is_in_bad_fork  # PyTorch calls it
from .initialization import _lazy_init, init, is_initialized
from .memory import (
    empty_cache,
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
)
from .random import get_rng_state, initial_seed, manual_seed, manual_seed_all, seed, set_rng_state
from .streams import Event, Stream, current_stream, stream


def is_available() -> bool:
    """Whether the device has at least one usable device."""
    return device_count() > 0


def device_count() -> int:
    """The number of devices."""
    return int(torch._C._accelerator_hooks_device_count())


def set_device(device: DeviceLike) -> None:
    """Makes ``device`` the current device of this thread."""
    _lazy_init()  # raises in a forked child, as torch.cuda.set_device does
    torch._C._accelerator_hooks_set_current_device(device_index(device))


class device:  # lowercase: the name PyTorch looks for
    """Context manager that makes ``device`` current, then restores."""

    def __init__(self, device: DeviceLike) -> None:
        self.idx = device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            _lazy_init()
        self.prev_idx = int(torch._C._accelerator_hooks_exchange_device(self.idx))

    def __exit__(self, *exc: object) -> None:
        torch._C._accelerator_hooks_maybe_exchange_device(self.prev_idx)


def synchronize(device: DeviceLike = None) -> None:
    """Waits for all work on ``device`` (default: the current one)."""
    # torch.accelerator.synchronize returns silently where PyTorch's lazy
    # initialization has not run, which includes a forked child: raise there.
    _lazy_init()
    torch.accelerator.synchronize(device_index(device))


__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_rng_state",
    "init",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "set_device",
    "set_rng_state",
    "stream",
    "synchronize",
]

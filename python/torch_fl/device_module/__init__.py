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
:mod:`.properties`, :mod:`.streams`, :mod:`.memory`, :mod:`.pools`, :mod:`.graphs`, :mod:`.random`,
:mod:`.amp`, :mod:`.nvtx` (user ranges the plugin's tools see), and :mod:`.initialization` (initialization
state and fork safety).

Functions here must not call their ``torch.accelerator`` twins where those
delegate back to this module (``is_available``, ``device_count``): they use
the C++ hooks directly instead.
"""

from __future__ import annotations

import torch

from . import nvtx
from ._index import DeviceLike, current_device, device_index
from .amp import get_amp_supported_dtype, is_bf16_supported
from .graphs import Graph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables
from .initialization import _is_in_bad_fork as _is_in_bad_fork  # PyTorch calls it
from .initialization import _lazy_init, init, is_initialized
from .memory import (
    empty_cache,
    get_allocator_backend,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_memory_stats,
)
from .pools import MemPool, use_mem_pool
from .properties import DeviceProperties, get_device_capability, get_device_name, get_device_properties
from .random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream


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


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current; a no-op for a tensor elsewhere."""

    def __init__(self, obj: torch.Tensor) -> None:
        on_device = obj.device.type == torch._C._get_privateuse1_backend_name()
        super().__init__(obj.get_device() if on_device else -1)


def synchronize(device: DeviceLike = None) -> None:
    """Waits for all work on ``device`` (default: the current one)."""
    # torch.accelerator.synchronize returns silently where PyTorch's lazy
    # initialization has not run, which includes a forked child: raise there.
    _lazy_init()
    torch.accelerator.synchronize(device_index(device))


__all__ = [
    "DeviceProperties",
    "Event",
    "Graph",
    "MemPool",
    "Stream",
    "StreamContext",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_allocator_backend",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_initialized",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "nvtx",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
    "use_mem_pool",
]

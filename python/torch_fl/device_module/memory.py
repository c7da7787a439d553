"""Device memory figures of the device module, in ``torch.cuda``'s names.

All of them go through PyTorch's ``torch.accelerator`` memory API, which
the C++ shim's allocator answers, so the two APIs always agree. By default
that is torch-fl's caching allocator (``cpp_shim/src/memory/caching_allocator.h``),
which keeps CUDA's statistics: small and large pools, segments, split
blocks, and a :func:`memory_snapshot` of every segment. Under the plugin
backend (``TORCH_FL_ALLOC_CONF=backend:plugin``, or a plugin that caches
itself) every allocation is a plugin call; the statistics are then the
plugin's aggregate figures (``TFL_MemoryStats``), with only the ``all``
pool, and the snapshot lists no segments.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _C
from ._index import DeviceLike, device_index, device_name


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by tensors on ``device``."""
    return torch.accelerator.memory_allocated(device_index(device))


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` since the last reset."""
    return torch.accelerator.max_memory_allocated(device_index(device))


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes the plugin's allocator holds on ``device``."""
    return torch.accelerator.memory_reserved(device_index(device))


def max_memory_reserved(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_reserved` since the last reset."""
    return torch.accelerator.max_memory_reserved(device_index(device))


def memory_stats(device: DeviceLike = None) -> dict[str, Any]:
    """Allocator statistics of ``device``, in ``torch.cuda.memory_stats`` form (flat ``"a.b.c"`` keys)."""
    return torch.accelerator.memory_stats(device_index(device))


def memory_stats_as_nested_dict(device: DeviceLike = None) -> dict[str, Any]:
    """:func:`memory_stats` as nested dictionaries (``stats["allocated_bytes"]["all"]["current"]``)."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Resets the peaks reported by :func:`memory_stats`."""
    torch.accelerator.reset_peak_memory_stats(device_index(device))


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Resets the accumulated counts (``allocated``/``freed`` keys and ``num_ooms``) of :func:`memory_stats`."""
    torch.accelerator.reset_accumulated_memory_stats(device_index(device))


def reset_max_memory_allocated(device: DeviceLike = None) -> None:
    """Resets the peak of :func:`max_memory_allocated`: as on CUDA, every peak (with a ``FutureWarning``)."""
    warnings.warn(
        f"torch.{device_name()}.reset_max_memory_allocated calls torch.{device_name()}.reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: DeviceLike = None) -> None:
    """Resets the peak of :func:`max_memory_reserved`: as on CUDA, every peak (with a ``FutureWarning``)."""
    warnings.warn(
        f"torch.{device_name()}.reset_max_memory_cached calls torch.{device_name()}.reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Returns cached, unused device memory to the plugin."""
    torch.accelerator.empty_cache()


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``."""
    free, total = torch.accelerator.get_memory_info(device_index(device))
    return int(free), int(total)


def memory_snapshot(mempool_id: object = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """Every segment the caching allocator holds, with its blocks, as ``torch.cuda.memory_snapshot``.

    Each segment is a dict with ``device``, ``address``, ``total_size``,
    ``allocated_size``, ``active_size``, ``requested_size``, ``stream``,
    ``segment_type`` (``"small"`` or ``"large"``) and ``blocks``, each
    block with ``address``, ``size``, ``requested_size`` and ``state``
    (``"active_allocated"``, ``"active_pending_free"`` or ``"inactive"``).
    Each also says its pool (``segment_pool_id``: ``(0, 0)`` for the default
    pool, a :class:`~torch_fl.device_module.pools.MemPool`'s id otherwise);
    ``mempool_id`` keeps the segments of that pool only. Allocation stack
    traces are not recorded (``frames`` is empty; ``include_traces`` is
    accepted for compatibility). Under the plugin backend (see the module
    docstring) the list is empty.
    """
    del include_traces
    segments: list[dict[str, Any]] = _snapshot()["segments"]
    if mempool_id is not None:
        wanted = list(mempool_id)  # type: ignore[call-overload]
        segments = [s for s in segments if s["segment_pool_id"] == wanted]
    return segments


def _snapshot(device: DeviceLike = None) -> dict[str, Any]:
    """The allocator's state as ``torch.cuda.memory._snapshot()``: ``segments`` and (empty) ``device_traces``."""
    del device  # as on CUDA, every device's segments
    snapshot: dict[str, Any] = json.loads(_C.memory_snapshot_json())
    snapshot["allocator_settings"] = {"backend": _C.allocator_backend()}
    return snapshot


def get_allocator_backend() -> str:
    """``"caching"`` when torch-fl's caching allocator serves the device, ``"plugin"`` when the plugin does."""
    return _C.allocator_backend()


def _format_size(value: int, scale_by: int) -> str:
    # CUDA's columns: the unit follows the metric's first value in the row.
    units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    unit = units[0]
    for bigger in units[1:]:
        if scale_by < 768 * 1024:
            break
        unit = bigger
        value //= 1024
        scale_by //= 1024
    return f"{value:6d} {unit}"


def _format_count(value: int, scale_by: int) -> str:
    units = [" ", "K", "M"]
    unit = units[0]
    for bigger in units[1:]:
        if scale_by < 750 * 1000:
            break
        unit = bigger
        value //= 1000
        scale_by //= 1000
    return f"{value:7d} {unit} "


_SUMMARY_METRICS: list[tuple[str, str, Callable[[int, int], str]]] = [
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "Reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "Reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
]


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """A human-readable table of :func:`memory_stats`, laid out like ``torch.cuda.memory_summary``.

    Columns are the current value, the peak and the totals allocated and
    freed since the last :func:`reset_accumulated_memory_stats`. Unless
    ``abbreviated``, each metric is followed by its large-pool and
    small-pool rows when the caching allocator keeps pools (see the module
    docstring). Byte totals read ``-`` when the plugin keeps the statistics
    itself: ``TFL_MemoryStats`` counts allocations, not the bytes they
    added up to.
    """
    idx = device_index(device)
    name = device_name()
    stats = memory_stats(idx)
    # Allocations were counted but no bytes: the byte totals are unknown.
    byte_totals_known = not (
        stats.get("allocated_bytes.all.allocated", 0) == 0 and stats.get("allocation.all.allocated", 0) > 0
    )
    width = 75
    lines = [
        "=" * width,
        f" PyTorch {name} memory summary, device ID {idx}",
        "-" * width,
        f"  {name} OOMs: {stats.get('num_ooms', 0):<12d} | device allocations: "
        f"{stats.get('num_device_alloc', 0):<10d} | frees: {stats.get('num_device_free', 0):<8d}",
        "=" * width,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    pools = [("all", label) for label in ("",)]
    if not abbreviated and any(key.endswith(".large_pool.current") for key in stats):
        pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    for key, label, fmt in _SUMMARY_METRICS:
        lines.append("-" * width)
        for pool, pool_label in pools:
            cells = []
            for part in ("current", "peak", "allocated", "freed"):
                value = int(stats.get(f"{key}.{pool}.{part}", 0))
                unknown = fmt is _format_size and part in ("allocated", "freed") and not byte_totals_known
                cells.append(f"{'-':>10}" if unknown else fmt(value, value))
            lines.append(f" {pool_label or label:<21} | " + " | ".join(cells) + " ")
    lines.append("=" * width)
    return "".join(f"|{line.ljust(width)}|\n" for line in lines)

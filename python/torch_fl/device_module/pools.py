"""Private memory pools of the device module, in ``torch.cuda``'s names: :class:`MemPool` and :func:`use_mem_pool`.

A pool is a set of segments of torch-fl's caching allocator that no other
allocation uses: tensors allocated while a thread routes its allocations to
the pool (``with use_mem_pool(pool):``) come from the pool's own segments,
so their addresses are never shared with tensors outside it, and the pool's
memory can be handed out, kept or given back as one. It is the memory model
of device graphs (a graph's tensors keep their addresses for every replay),
and on its own what ``torch.cuda.MemPool`` is for: keeping a phase's
allocations apart from the rest (an inference cache, a buffer pool).

A pool belongs to the device current when it was made. It lives while the
:class:`MemPool` object does and while tensors it served are alive; once
both are gone, ``empty_cache()`` gives its segments back to the plugin.
:func:`memory_snapshot` labels each segment with its pool
(``segment_pool_id``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from .. import _C
from ._index import DeviceLike, current_device, device_index


class MemPool:
    """A private pool of the caching allocator on the current device, as ``torch.cuda.MemPool``.

    Example::

        pool = torch.sim.MemPool()
        with torch.sim.use_mem_pool(pool):
            cache = torch.empty(1 << 20, device="sim")  # from the pool's own segments
        assert pool.use_count() == 1
    """

    def __init__(self) -> None:
        self._device = current_device()
        self._id: tuple[int, int] = _C.mempool_create(self._device)
        # Released when the object goes, however it goes (a finalizer runs
        # at most once, and at interpreter exit too).
        self._release = weakref.finalize(self, _C.mempool_release, self._device, self._id)

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, ``(n, 0)`` as CUDA numbers user pools (``segment_pool_id`` in snapshots)."""
        return self._id

    @property
    def device(self) -> int:
        """The device index the pool belongs to."""
        return self._device

    def use_count(self) -> int:
        """The pool's uses: this object's, plus one per graph captured into it."""
        return int(_C.mempool_use_count(self._device, self._id))

    def snapshot(self) -> list[dict[str, Any]]:
        """The pool's segments, as :func:`memory_snapshot` lists them."""
        from .memory import memory_snapshot

        return memory_snapshot(mempool_id=self._id)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: DeviceLike = None) -> Iterator[None]:
    """Routes this thread's allocations on ``device`` (default: the pool's) to ``pool`` inside the block.

    Other threads allocate as before; nested blocks route to the innermost
    pool. Raises:
        RuntimeError: the pool belongs to another device, or torch-fl's
            caching allocator is off (``TORCH_FL_ALLOC_CONF=backend:plugin``).
    """
    index = pool.device if device is None else device_index(device)
    if index != pool.device:
        raise RuntimeError(f"use_mem_pool: the pool belongs to device {pool.device}, not {index}")
    _C.mempool_begin(index, pool.id)
    try:
        yield
    finally:
        _C.mempool_end(index, pool.id)

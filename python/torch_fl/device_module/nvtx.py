"""``torch.<device>.nvtx``: user ranges that the plugin's own tools see, shaped like ``torch.cuda.nvtx``.

A range opened here reaches the plugin's ``range_push`` (ABI 1.8), as
``torch.cuda.nvtx`` reaches NVTX for Nsight: the vendor's profiler shows it
around the device work it encloses, and a plugin that records activity
reports it in :func:`torch_fl.trace` (a ``"range"`` record). While a
:func:`torch_fl.trace` or ``torch.profiler`` session runs, every
``torch.profiler.record_function`` range reaches the plugin too. With a
plugin that has no range entries these calls only keep the depth count::

    with torch.sim.nvtx.range("forward"):
        y = model(x)
    torch.sim.nvtx.mark("step done")
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import _C

__all__ = ["mark", "range", "range_pop", "range_push"]

_depth = threading.local()


def _current() -> int:
    return int(getattr(_depth, "value", 0))


def range_push(msg: str) -> int:
    """Opens a range named ``msg`` on this thread; returns its 0-based depth."""
    _C.range_push(msg)
    depth = _current()
    _depth.value = depth + 1
    return depth


def range_pop() -> int:
    """Closes this thread's innermost range; returns the depth it had, or -1 when none was open."""
    depth = _current()
    if depth == 0:
        return -1
    _C.range_pop()
    _depth.value = depth - 1
    return depth - 1


def mark(msg: str) -> None:
    """Marks an instant named ``msg``."""
    _C.range_mark(msg)


@contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    """A range around a ``with`` block; ``msg`` is formatted with ``args`` and ``kwargs`` as ``str.format``."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()

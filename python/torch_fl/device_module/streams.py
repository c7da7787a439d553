"""Streams and events of the device module, as ``torch.cuda`` offers them.

They are PyTorch's device-generic ``torch.Stream`` and ``torch.Event``,
which the C++ shim backs with the plugin's streams and events.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ._index import DeviceLike, current_device, device_index, device_name


def Stream(device: DeviceLike = None, priority: int = 0) -> torch.Stream:
    """A new stream on ``device`` (default: the current one): a ``torch.Stream``."""
    return torch.Stream(device=torch.device(device_name(), device_index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """A new event of the current device: a ``torch.Event``.

    A factory rather than a subclass: PyTorch's event methods require
    exactly ``torch.Event`` for the other event.
    """
    return torch.Event(
        device=torch.device(device_name(), current_device()),
        enable_timing=enable_timing,
        blocking=blocking,
        interprocess=interprocess,
    )


def current_stream(device: DeviceLike = None) -> torch.Stream:
    """The current stream of ``device`` on this thread."""
    return torch.accelerator.current_stream(device_index(device))


@contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Context manager that makes ``s`` the current stream of its device."""
    if s is None:
        yield
        return
    prev = torch.accelerator.current_stream(s.device_index)
    torch.accelerator.set_stream(s)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)

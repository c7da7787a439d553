"""Streams and events of the device module, as ``torch.cuda`` offers them.

They are PyTorch's device-generic ``torch.Stream`` and ``torch.Event``,
which the C++ shim backs with the plugin's streams and events: ``query``,
``synchronize``, ``wait_event``, ``wait_stream``, ``record_event`` and
``elapsed_time`` behave as CUDA's. Each thread has a current stream per
device; work is queued on the current stream of the current device.
"""

from __future__ import annotations

import torch

from ._index import DeviceLike, current_device, device_index, device_name

# c10's number for PrivateUse1, the device type of every torch-fl stream.
_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1.value)


def Stream(device: DeviceLike = None, priority: int = 0) -> torch.Stream:
    """A new stream on ``device`` (default: the current one): a ``torch.Stream``.

    A negative ``priority`` asks for a high-priority stream (a plugin may
    ignore priorities). As on CUDA, streams come from a per-device pool.
    """
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
    """The current stream of ``device`` (default: the current device) on this thread."""
    return torch.accelerator.current_stream(device_index(device))


def default_stream(device: DeviceLike = None) -> torch.Stream:
    """The default stream of ``device`` (default: the current device): the plugin's own, never destroyed."""
    # The shim gives each device's default stream the id 0, as CUDA does.
    return torch.Stream(stream_id=0, device_index=device_index(device), device_type=_DEVICE_TYPE)


def set_stream(stream: torch.Stream | None) -> None:
    """Makes ``stream`` the current stream of its device, and that device current, on this thread.

    ``None`` does nothing. Prefer :func:`stream`, which restores the
    previous stream and device.
    """
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream (and its device) current, then restores both.

    As ``torch.cuda.StreamContext``: inside, the stream's device is the
    current device; on exit the current streams of both the previous device
    and the stream's device are restored, and the previous device is
    current again. ``None`` makes it a no-op.
    """

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.src_prev_stream: torch.Stream | None = None
        self.dst_prev_stream: torch.Stream | None = None

    def __enter__(self) -> None:
        target = self.stream
        if target is None:
            return
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device != target.device:
            self.dst_prev_stream = current_stream(target.device_index)
        torch.accelerator.set_stream(target)

    def __exit__(self, *exc: object) -> None:
        if self.stream is None or self.src_prev_stream is None:
            return
        if self.dst_prev_stream is not None:
            torch.accelerator.set_stream(self.dst_prev_stream)
        torch.accelerator.set_stream(self.src_prev_stream)


def stream(stream: torch.Stream | None) -> StreamContext:
    """Context manager that makes ``stream`` current on its device (see :class:`StreamContext`)."""
    return StreamContext(stream)

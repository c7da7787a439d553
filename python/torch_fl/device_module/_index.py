"""Which device a call means: the device name bound in this process and index resolution.

Every function of the device module takes ``device`` the way ``torch.cuda``
does (``None`` for the current device, an index, a string or a
``torch.device``); this is the one place that turns it into an index.
"""

from __future__ import annotations

from typing import Union

import torch

from .. import _native

#: What the device module's functions accept as ``device``.
DeviceLike = Union[torch.device, str, int, None]


def device_name() -> str:
    """The torch-fl device name of this process (``"sim"``).

    The device module is only reachable as ``torch.<name>`` once a plugin
    is registered, so a missing name means it was imported directly.
    """
    name = _native.bound_device_name()
    if name is None:
        raise RuntimeError(
            "no torch-fl device is registered in this process: call torch_fl.register_device_plugin(name=...) "
            "first, then use torch.<name>"
        )
    return name


def current_device() -> int:
    """The index of the current device of this thread."""
    return int(torch._C._accelerator_hooks_get_current_device())


def device_index(device: DeviceLike, optional: bool = True) -> int:
    """The index ``device`` designates; ``None`` means the current device when ``optional``."""
    if device is None:
        if optional:
            return current_device()
        raise ValueError(f"a {device_name()} device is required")
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    name = device_name()
    if dev.type != name:
        raise ValueError(f"expected a {name} device, got {dev}")
    return current_device() if dev.index is None else dev.index

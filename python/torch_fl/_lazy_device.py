"""The autoloaded device until its plugin is registered: a lazy ``torch.<name>``.

:mod:`torch_fl.autoload` installs it at ``import torch``; the first attribute
use calls the registrar it was given (``register_device_plugin``), and
registration swaps in the real device module with :func:`finish`. Kept apart
from both so that registration asks "is a device pending?" without
importing autoload, which imports registration.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["finish", "install", "pending_device"]

#: ``register(name, plugin_path)``: registers the device's plugin.
Registrar = Callable[[str, "str | None"], object]


class _LazyDeviceModule(types.ModuleType):
    """``torch.<name>`` until the plugin is registered; the first attribute use registers it."""

    def __init__(self, name: str, plugin_path: str | None, register: Registrar) -> None:
        super().__init__(f"torch.{name}", f"torch-fl device {name!r}, registered at first use")
        self._torchfl_device = name
        self._torchfl_path = plugin_path
        self._torchfl_register = register

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._torchfl_register(self._torchfl_device, self._torchfl_path)
        return getattr(sys.modules[f"torch.{self._torchfl_device}"], attr)


_pending: _LazyDeviceModule | None = None


def install(name: str, plugin_path: str | None, register: Registrar) -> types.ModuleType:
    """Makes a lazy ``torch.<name>`` the pending device and returns it (the caller registers it with PyTorch)."""
    global _pending
    _pending = _LazyDeviceModule(name, plugin_path, register)
    return _pending


def pending_device() -> str | None:
    """The autoloaded device name while its plugin is not registered yet."""
    return None if _pending is None else _pending._torchfl_device


def finish(name: str, device_module: types.ModuleType) -> bool:
    """Replaces the lazy ``torch.<name>`` with the real module; False when nothing was pending."""
    global _pending
    if _pending is None or _pending._torchfl_device != name:
        return False
    setattr(torch, name, device_module)
    sys.modules[f"torch.{name}"] = device_module
    _pending = None
    return True

"""Autoload: the device exists after ``import torch``; the plugin initializes at first use.

:func:`prepare` (called by the ``torch.backends`` entry point, see the
``torchfl_autoload`` package) finds the plugin and validates its library
without initializing it, then names PyTorch's custom device, generates the
``Tensor.<name>()`` methods and installs ``torch.<name>`` as a lazy module.
The first use of the device initializes the plugin through
:func:`torch_fl.register_device_plugin`: a device factory or ``.to()`` (PyTorch
calls ``torch.<name>._lazy_init()`` first) or any ``torch.<name>``
attribute. A plugin that cannot be used is reported as one warning naming
the package, its entry point and the cause, and the device stays absent.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from . import _native, _paths, plugins

__all__ = ["pending_device", "prepare"]

_pending: _LazyDeviceModule | None = None


class _LazyDeviceModule(types.ModuleType):
    """``torch.<name>`` until the plugin is registered; the first attribute use registers it."""

    def __init__(self, name: str, plugin_path: str | None) -> None:
        super().__init__(f"torch.{name}", f"torch-fl device {name!r}, registered at first use")
        self._torchfl_device = name
        self._torchfl_path = plugin_path

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        from .registration import register_device_plugin

        register_device_plugin(name=self._torchfl_device, plugin_path=self._torchfl_path)
        return getattr(sys.modules[f"torch.{self._torchfl_device}"], attr)


def pending_device() -> str | None:
    """The autoloaded device name while its plugin is not registered yet."""
    return None if _pending is None else _pending._torchfl_device


def _locate(name: str) -> tuple[str | None, str]:
    """The library for ``name`` without initializing it, and how to name its source in messages."""
    for package in plugins.packaged_plugins(name):
        source = f"plugin package {package.package} (entry point {package.name} = {package.entry_point})"
        if package.error is not None:
            raise RuntimeError(f"{source}: {package.error}")
        return package.path, source
    for candidate, path, description, _options in _paths.bundled_candidates():
        if candidate == name:
            return path, description
    # TORCH_FL_PLUGIN_PATH or a preloaded library: discovery at first use.
    return None, "TORCH_FL_PLUGIN_PATH"


def prepare(name: str) -> None:
    """Makes ``name`` a device of this process whose plugin registers at first use."""
    global _pending
    _native.check_device_name(name)
    path, source = _locate(name)
    if path is not None:
        try:
            info = _native.probe_plugin(path)
        except Exception as e:
            raise RuntimeError(f"{source}: {type(e).__name__}: {e}") from e
        if info["name"] != name:
            raise RuntimeError(f"{source}: the library {path} is the plugin {info['name']!r}, not {name!r}")
    torch.utils.backend_registration.rename_privateuse1_backend(name)
    module = _LazyDeviceModule(name, path)
    torch._register_device_module(name, module)
    torch.utils.backend_registration.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    _pending = module


def finish(name: str, device_module: types.ModuleType) -> bool:
    """Replaces the lazy ``torch.<name>`` with the real module; False when nothing was pending."""
    global _pending
    if _pending is None or _pending._torchfl_device != name:
        return False
    setattr(torch, name, device_module)
    sys.modules[f"torch.{name}"] = device_module
    _pending = None
    return True

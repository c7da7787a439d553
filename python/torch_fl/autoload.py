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

import torch

from . import _lazy_device, _native, _paths, plugins
from .registration import register_device_plugin

__all__ = ["prepare"]


def _register(name: str, plugin_path: str | None) -> None:
    register_device_plugin(name=name, plugin_path=plugin_path)


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
    module = _lazy_device.install(name, path, _register)
    torch._register_device_module(name, module)
    torch.utils.backend_registration.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )

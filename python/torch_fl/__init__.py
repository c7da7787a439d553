"""torch-fl: any accelerator as a first-class PyTorch device.

An accelerator ships as a plugin: one shared library implementing torch-fl's
stable C ABI. Register it once and use PyTorch as usual::

    import torch
    import torch_fl

    torch_fl.register_device_plugin(name="sim")   # the bundled simulated accelerator
    x = torch.randn(2, 3).to("sim")
    y = (x + 1).relu()
    print(y.device)                                 # sim:0

See :func:`register_device_plugin`, the exceptions in :mod:`torch_fl.errors`
and ``torch.<name>`` (e.g. ``torch.sim``) for streams, events, memory and
random state.
"""

from __future__ import annotations

# torch first: the shim this package loads links against it (see _shim).
import torch  # noqa: F401

from . import _import_hooks, _native, _shim

# The shim (the extension module torch_fl._C) registers the device guard,
# hooks, allocator and minimal operators as it loads; it must be in place
# before any backward pass so the autograd engine sees the device
# (docs/design/privateuse1-notes.md, P1). Which shim: the bundled one, or one
# built for the installed torch (_shim). Everything below may use torch_fl._C.
_shim.load()

from . import fallback  # noqa: E402 - needs the shim
from .errors import (  # noqa: E402 - after the shim, like every import here
    AbiVersionError,
    AlreadyInitializedError,
    BadForkError,
    DeviceNameConflictError,
    DeviceRegistrationError,
    DuplicateOperatorError,
    IncompatiblePluginError,
    InsecurePluginError,
    InvalidCallError,
    InvalidDeviceError,
    InvalidDeviceNameError,
    InvalidPluginError,
    InvalidSettingError,
    KernelError,
    KernelSymbolError,
    MetadataMismatchError,
    MissingBootstrapSymbolError,
    MissingRequiredEntryError,
    NotASharedLibraryError,
    OperatorArityError,
    OperatorNotFoundError,
    OperatorRegistrationError,
    OperatorSchemaError,
    OutOfMemoryError,
    PluginFileNotFoundError,
    PluginInitError,
    PluginInitTimeoutError,
    PluginLoadError,
    PluginNotFoundError,
    PluginRuntimeError,
    PluginWarning,
    TorchFLError,
    TorchIntegrationError,
    TorchVersionError,
    UnimplementedError,
    WrongArchitectureError,
)
from .fallback import fallback_mode, fallback_stats, reset_fallback_stats, set_fallback_mode  # noqa: E402
from .migration import Migration, migrate, migration_stats, reset_migration_stats  # noqa: E402

__version__: str = _native.__version__
#: The plugin ABI version this torch-fl speaks.
ABI_VERSION: str = _native.ABI_VERSION


# The shim reads TORCH_FL_FALLBACK itself as it loads.
fallback.install()


def _on_torchvision(module: object) -> None:
    from . import torchvision_autocast

    torchvision_autocast.install(module)  # type: ignore[arg-type]


# torchvision's autocast policy for its detection operators covers CUDA,
# CPU and XPU only; the device gets the same (torchvision_autocast.py).
_import_hooks.when_imported("torchvision", _on_torchvision)

from .compat import CompatReport, test_compatibility  # noqa: E402 - needs the shim
from .device_trace import DeviceTrace, NativeRecord, TraceEvent, trace  # noqa: E402 - needs the shim
from .operators import OperatorHandle, register_operator  # noqa: E402 - needs the shim
from .plugins import PackagedPlugin, PluginListing, list_plugins  # noqa: E402
from .profiling import LayerProfile, OperatorLayerTime, profile_layers  # noqa: E402
from .registration import PluginHandle, register_device_plugin  # noqa: E402 - needs the shim


def kernel_symbol(op: str) -> str:
    """Return the symbol a plugin exports to implement ``op``.

    Example:
        >>> kernel_symbol("add_.Tensor")
        'torch_fl_op_add__Tensor'
    """
    return _native.kernel_symbol(op)


__all__ = [
    "ABI_VERSION",
    "AbiVersionError",
    "AlreadyInitializedError",
    "BadForkError",
    "CompatReport",
    "DeviceNameConflictError",
    "DeviceRegistrationError",
    "DeviceTrace",
    "DuplicateOperatorError",
    "IncompatiblePluginError",
    "InsecurePluginError",
    "InvalidCallError",
    "InvalidDeviceError",
    "InvalidDeviceNameError",
    "InvalidPluginError",
    "InvalidSettingError",
    "KernelError",
    "KernelSymbolError",
    "LayerProfile",
    "MetadataMismatchError",
    "Migration",
    "MissingBootstrapSymbolError",
    "MissingRequiredEntryError",
    "NativeRecord",
    "NotASharedLibraryError",
    "OperatorArityError",
    "OperatorHandle",
    "OperatorLayerTime",
    "OperatorNotFoundError",
    "OperatorRegistrationError",
    "OperatorSchemaError",
    "OutOfMemoryError",
    "PackagedPlugin",
    "PluginFileNotFoundError",
    "PluginHandle",
    "PluginInitError",
    "PluginInitTimeoutError",
    "PluginListing",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginRuntimeError",
    "PluginWarning",
    "TorchFLError",
    "TorchIntegrationError",
    "TorchVersionError",
    "TraceEvent",
    "UnimplementedError",
    "WrongArchitectureError",
    "__version__",
    "fallback_mode",
    "fallback_stats",
    "kernel_symbol",
    "list_plugins",
    "migrate",
    "migration_stats",
    "profile_layers",
    "register_device_plugin",
    "register_operator",
    "reset_fallback_stats",
    "reset_migration_stats",
    "set_fallback_mode",
    "test_compatibility",
    "trace",
]

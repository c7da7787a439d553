"""The torch-fl exception hierarchy, its one warning, and what PyTorch operations raise.

:class:`PluginWarning` (a ``UserWarning``) says that a plugin registered, or
a plugin package was skipped, without something it declares; everything else
here is an error.

**torch-fl's own API** raises :class:`TorchFLError` subclasses:
``register_device_plugin``, ``register_operator``, the other ``torch_fl``
functions and the plugin objects of ``torch_fl._native``. Each class
corresponds to one variant of the Rust core's error enum (the mapping lives
in ``crates/torchfl-python/src/error.rs``); where a builtin or PyTorch
exception describes the same situation, the class derives from it too, so
``except FileNotFoundError`` or ``except torch.OutOfMemoryError`` keep
working. The classes under :class:`OperatorRegistrationError` have no Rust
counterpart: :func:`torch_fl.register_operator` checks schemas and Python
callables itself, in Python, where PyTorch's schema parser lives.

**PyTorch operations on a plugin device** (tensor operators, copies,
allocations, autograd, and ``torch.<name>``/``torch.accelerator`` calls such
as ``synchronize``, streams and events) run in PyTorch's C++ dispatcher,
whose exceptions PyTorch itself turns into Python ones; torch-fl cannot
raise its own classes there. A failure the plugin reports raises, as the
same failure of CUDA's runtime does:

- out of device memory: ``torch.OutOfMemoryError``; the message names the
  plugin, the device (``sim:0``), the size requested and the bytes in use,
  and says how to free memory;
- a kernel or runtime call that fails (any other status code):
  ``torch.AcceleratorError``, a ``RuntimeError`` whose ``error_code`` is the
  plugin's ``TFL_ErrorCode``; the message names the plugin (name and file),
  the operator or runtime entry, the status code (``INTERNAL``,
  ``DEVICE_LOST``, ...) and the plugin's own message;
- a kernel that returns ``UNIMPLEMENTED``: the operator runs through the CPU
  fallback instead, or, with ``TORCH_FL_FALLBACK=error``, raises
  ``NotImplementedError`` naming the kernel symbol to export;
- a runtime entry the plugin does not implement: ``NotImplementedError``.

A plugin message that is not valid UTF-8 has each invalid byte sequence
replaced by U+FFFD on either path, so the documented class is raised, never
a ``UnicodeDecodeError``.

:class:`OutOfMemoryError` and :class:`KernelError` are the core's variants for
allocations and kernel launches torch-fl makes itself (the Rust API, e.g.
``torchfl-abi verify``); no Python API makes such calls, and inside PyTorch
operations the classes above apply.

Messages name the plugin, file, operator or device and say what to do next.
"""

from __future__ import annotations

import torch

__all__ = [
    "AbiVersionError",
    "AlreadyInitializedError",
    "BadForkError",
    "DeviceNameConflictError",
    "DeviceRegistrationError",
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
    "MetadataMismatchError",
    "MissingBootstrapSymbolError",
    "MissingRequiredEntryError",
    "NotASharedLibraryError",
    "OperatorArityError",
    "OperatorNotFoundError",
    "OperatorRegistrationError",
    "OperatorSchemaError",
    "OutOfMemoryError",
    "PluginFileNotFoundError",
    "PluginInitError",
    "PluginInitTimeoutError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginRuntimeError",
    "PluginWarning",
    "TorchFLError",
    "TorchIntegrationError",
    "TorchVersionError",
    "UnimplementedError",
    "WrongArchitectureError",
]


class TorchFLError(Exception):
    """Base class of every torch-fl error."""


# --- finding, loading and validating a plugin -------------------------------


class PluginLoadError(TorchFLError):
    """A plugin could not be found, loaded, validated or initialized."""


class PluginNotFoundError(PluginLoadError, LookupError):
    """No plugin serves the requested device name (discovery found none)."""


class PluginFileNotFoundError(PluginLoadError, FileNotFoundError):
    """The plugin file does not exist."""


class InsecurePluginError(PluginLoadError, PermissionError):
    """Other users can write the plugin file or its directory (``TORCH_FL_ALLOW_WRITABLE_PLUGINS=1`` overrides)."""


class NotASharedLibraryError(PluginLoadError):
    """The file is not a shared library the dynamic loader accepts."""


class WrongArchitectureError(PluginLoadError):
    """The file is a shared library for another CPU architecture."""


class MissingBootstrapSymbolError(PluginLoadError):
    """The library does not export ``torch_fl_plugin_get_api``."""


class AbiVersionError(PluginLoadError):
    """The plugin's ABI major version differs from torch-fl's."""


class InvalidPluginError(PluginLoadError):
    """The plugin's tables are malformed."""


class MissingRequiredEntryError(InvalidPluginError):
    """A required entry of the plugin's function table is NULL."""


class KernelSymbolError(InvalidPluginError):
    """An op-table kernel is not exported under its conventional symbol."""


class PluginInitError(PluginLoadError):
    """The plugin's ``initialize`` failed."""


class AlreadyInitializedError(PluginLoadError):
    """The plugin was initialized earlier in this process with other options."""


class PluginInitTimeoutError(PluginLoadError, TimeoutError):
    """The plugin did not finish loading within ``TORCH_FL_INIT_TIMEOUT`` seconds.

    The message names the plugin and the call it is stuck in. Its loading
    thread is left running (a thread cannot be stopped safely); other
    plugins and registrations are not blocked by it.
    """


# --- binding a plugin to the device name ------------------------------------


class DeviceRegistrationError(TorchFLError):
    """A plugin could not be registered as a PyTorch device."""


class InvalidDeviceNameError(DeviceRegistrationError, ValueError):
    """The device name is malformed or is one of PyTorch's own device types."""


class DeviceNameConflictError(DeviceRegistrationError):
    """The process already registered another custom device name."""


class IncompatiblePluginError(DeviceRegistrationError):
    """The plugin cannot use the memory of the device's runtime plugin."""


class MetadataMismatchError(DeviceRegistrationError, ValueError):
    """``metadata=`` expects something the plugin does not report."""


class TorchVersionError(DeviceRegistrationError):
    """The plugin needs a newer PyTorch than the one installed."""


class TorchIntegrationError(DeviceRegistrationError, RuntimeError):
    """Registering the device or a kernel with PyTorch failed."""


# --- using a registered plugin ----------------------------------------------


class PluginRuntimeError(TorchFLError, RuntimeError):
    """A runtime call into the plugin (copy, stream, event) failed."""


class InvalidDeviceError(PluginRuntimeError, IndexError):
    """A device index outside the plugin's range."""


class OutOfMemoryError(PluginRuntimeError, torch.OutOfMemoryError):
    """A plugin device ran out of memory during an allocation torch-fl made itself.

    Inside PyTorch operations the C++ shim raises ``torch.OutOfMemoryError``
    itself (see the module documentation).
    """


class UnimplementedError(PluginRuntimeError, NotImplementedError):
    """The plugin does not implement an optional entry or this request."""


class KernelError(PluginRuntimeError):
    """A plugin kernel torch-fl launched itself returned a failed status.

    Inside PyTorch operations a failing kernel raises ``torch.AcceleratorError``
    (see the module documentation).
    """


class BadForkError(TorchFLError, RuntimeError):
    """The device was used in a child forked from a process that had initialized it.

    A plugin's threads and device state do not survive ``fork()``, so such a
    child (``os.fork()``, multiprocessing's "fork" start method) must not use
    the device: use the "spawn" or "forkserver" start method. Operators on
    device tensors raise a plain ``RuntimeError`` with the same message (the
    C++ shim cannot raise torch-fl classes), as CUDA does.
    """


class OperatorNotFoundError(TorchFLError, LookupError):
    """No registered plugin implements the operator."""


class InvalidCallError(TorchFLError, ValueError):
    """A malformed call was refused before reaching the plugin."""


class InvalidSettingError(TorchFLError, ValueError):
    """A torch-fl environment variable (e.g. ``TORCH_FL_INIT_TIMEOUT``) has an unusable value."""


# --- registering operators (torch_fl.register_operator) ---------------------


class OperatorRegistrationError(TorchFLError):
    """:func:`torch_fl.register_operator` refused a registration."""


class DuplicateOperatorError(OperatorRegistrationError):
    """The operator is already registered (by a plugin's op table or an earlier call)."""


class OperatorSchemaError(OperatorRegistrationError, ValueError):
    """The schema is missing, does not parse, or names another operator."""


class OperatorArityError(OperatorRegistrationError, TypeError):
    """A kernel's arguments or returns do not match the operator's schema."""


# --- warnings -----------------------------------------------------------------


class PluginWarning(UserWarning):
    """A plugin registered, but without something it declares.

    :func:`register_device_plugin` shows one for each warning of the
    plugin's validation: an ATen operator this PyTorch lacks, a custom
    operator whose schema is invalid or names another operator (left out), a
    device reporting ``total_memory`` 0. ``torchfl-abi verify`` fails the
    check of the loading stage with the same words, so a vendor's CI catches
    it first.
    """

"""``register_device_plugin``: making a plugin a PyTorch device.

Order matters and is fixed here (see docs/design/privateuse1-notes.md):

1. load or discover the plugin (the Rust core validates and initializes it);
2. bind it to the device name: the C++ shim receives the device runtime
   first, then the kernel that serves each operator;
3. the first time only: rename PyTorch's PrivateUse1 backend, register the
   ``torch.<name>`` module (PyTorch imports it on the first device tensor)
   and generate ``Tensor.<name>()``, ``Module.<name>()`` and the storage
   methods that ``torch.save``/``torch.load`` use.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import torch

from . import (
    _C,
    _exit,
    _lazy_device,
    _native,
    compiler,
    composites,
    device_module,
    device_trace,
    distributed,
    operators,
    plugins,
)
from .errors import (
    DeviceNameConflictError,
    InvalidDeviceNameError,
    InvalidSettingError,
    MetadataMismatchError,
    PluginWarning,
)

__all__ = ["PluginHandle", "register_device_plugin"]

# Serializes registrations: binding, PyTorch's one-time device set-up and
# wiring must not interleave. The plugins bound so far are the Rust core's
# record (``_native.bound_plugins()``), not kept here.
_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    # A thread of the parent may have held the lock when the process
    # forked; in the child no thread would ever release it.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_lock_in_child)


@dataclass(frozen=True)
class PluginHandle:
    """What :func:`register_device_plugin` registered.

    Attributes:
        device: the device name (``torch.device(device)`` now works).
        plugin: the native plugin: identity, ABI version, capabilities,
            devices and operators.
        origin: where the plugin was found (a path, ``TORCH_FL_PLUGIN_PATH``,
            a preloaded library, or the bundled simulated accelerator).
        priority: the priority it was registered with.
        registrations: ``{operator: outcome}`` for the operators this call
            routed to the plugin ("registered", "registered_as_out",
            "skipped_composite_implicit", "skipped_view", "skipped_builtin",
            "unknown_op: ..." for ATen operators this PyTorch lacks, or
            "refused: ..." when PyTorch refused a registration).
    """

    device: str
    plugin: _native.Plugin
    origin: str
    priority: int
    registrations: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The plugin's own name (``TFL_PluginInfo.name``)."""
        return self.plugin.name

    @property
    def vendor(self) -> str:
        return self.plugin.vendor

    @property
    def plugin_version(self) -> str:
        return self.plugin.plugin_version

    @property
    def abi_version(self) -> str:
        """The plugin ABI version the plugin implements, e.g. ``"1.0"``."""
        return self.plugin.abi_version

    @property
    def capabilities(self) -> list[str]:
        return self.plugin.capabilities

    @property
    def device_count(self) -> int:
        return self.plugin.device_count

    @property
    def devices(self) -> list[dict[str, Any]]:
        """Properties of each device: name, total_memory, compute_units, ..."""
        return [self.plugin.device_properties(i) for i in range(self.plugin.device_count)]

    @property
    def ops(self) -> list[str]:
        """The operators the plugin implements (its op table)."""
        return self.plugin.ops

    def __repr__(self) -> str:
        return (
            f"PluginHandle(device={self.device!r}, plugin={self.plugin.name!r} "
            f"{self.plugin.plugin_version}, abi={self.abi_version}, devices={self.device_count}, "
            f"ops={len(self.ops)}, origin={self.origin!r})"
        )


def _check_name_is_free(name: str) -> None:
    """Refuses a name whose torch.<name> module or generated methods would shadow PyTorch's own.

    PyTorch exposes the device as ``torch.<name>`` and generates
    ``Tensor.<name>()``, ``Tensor.is_<name>`` and the same on modules and
    storages; it fails half-way when one exists (``fx``, ``shared``, ``float``).
    """
    owners: list[tuple[str, Any]] = [("torch", torch)]
    owners += [
        (f"torch.{cls.__qualname__}", cls)
        for cls in (torch.Tensor, torch.nn.Module, torch.TypedStorage, torch.UntypedStorage)
    ]
    for label, owner in owners:
        for attr in (name,) if owner is torch else (name, f"is_{name}"):
            if hasattr(owner, attr):
                raise InvalidDeviceNameError(
                    f"{name!r} cannot be a device name: PyTorch would expose the device as torch.{name} and "
                    f"generate {label}.{attr}, but {label}.{attr} already exists. Choose another name, "
                    'e.g. the accelerator\'s product name ("ascend", "npu0")'
                )


def _install_torch_device(name: str, plugin: _native.Plugin) -> None:
    # Autoload (torch_fl.autoload) already named the device, generated the
    # methods and installed a lazy torch.<name>: only the module is swapped.
    autoloaded = _lazy_device.pending_device() == name
    if not autoloaded:
        try:
            torch.utils.backend_registration.rename_privateuse1_backend(name)
        except RuntimeError as e:
            pending = _lazy_device.pending_device()
            why = (
                f"torch-fl autoloaded the device {pending!r} at import (TORCH_FL_DEVICE or an installed plugin "
                "package); use it, or set TORCH_FL_AUTOLOAD=0"
                if pending is not None
                else "another extension registered it. Use that extension's device, or a separate process"
            )
            raise DeviceNameConflictError(
                f"PyTorch's custom device is already named {torch._C._get_privateuse1_backend_name()!r} "
                f"in this process, so torch-fl cannot name it {name!r}: {why}"
            ) from e
    compiler.install(device_module, name, plugin.label, "host_addressable_memory" in plugin.capabilities)
    # torch.accelerator.Graph finds graphs by the renamed
    # backend's name, so they can only be registered now.
    _C.register_graph_impl()
    if autoloaded:
        _lazy_device.finish(name, device_module)
        return
    torch._register_device_module(name, device_module)
    # torch.distributed: the "tfl" c10d backend as the device type's default.
    distributed.install(name)
    torch.utils.backend_registration.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


PathLike = Union[str, Path]


def register_device_plugin(
    name: str,
    plugin_path: PathLike | None = None,
    priority: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> PluginHandle:
    """Makes an accelerator plugin the PyTorch device ``name``.

    After ``register_device_plugin(name="sim")``, ``torch.device("sim:0")``,
    ``tensor.to("sim")``, ``model.to("sim")`` and ``torch.sim`` work, and
    operators run on the plugin's kernels.

    Args:
        name: the device name, e.g. ``"ascend"``. One per process; PyTorch's
            own device types (``"cuda"``, ``"cpu"``, ...) are refused.
        plugin_path: the plugin's shared library. Without it the plugin is
            discovered by name: ``TORCH_FL_PLUGIN_PATH``, then libraries
            already loaded with ``ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)``,
            then installed plugin packages (entry points ``torch_fl.plugins``,
            see :mod:`torch_fl.plugins`), then the bundled simulated
            accelerator for ``"sim"``.
        priority: when several plugins serve ``name``, each operator runs
            on the kernel of the highest priority (ties keep the plugin
            registered first). The first plugin also provides the device's
            memory, streams and events. Default: the priority a plugin
            package declares, else 0.
        metadata: values the plugin must report, e.g.
            ``{"min_torch_version": "2.4", "vendor": "Acme"}``; a mismatch
            raises :class:`~torch_fl.MetadataMismatchError`.

    Returns:
        A :class:`PluginHandle` describing the plugin and what was registered.

    Raises:
        torch_fl.TorchFLError: a subclass naming what went wrong and what to
            do: the plugin was not found or not loadable, its ABI does not
            match, the name is taken or invalid, the metadata differs, ...
            (:class:`~torch_fl.BadForkError` in a child forked from a process
            that had initialized a plugin: use the "spawn" start method;
            :class:`~torch_fl.PluginInitTimeoutError` when the plugin does
            not finish loading within ``TORCH_FL_INIT_TIMEOUT`` seconds,
            default 60, ``0`` for no limit).
        TypeError: an argument of the wrong type.
        ValueError: ``priority`` outside the 32-bit range
            (:class:`~torch_fl.MetadataMismatchError`, also a ValueError, for
            a ``metadata`` key no plugin reports).
        KeyboardInterrupt: Ctrl-C while the plugin loads (its loading
            thread is left running).

    Example::

        import torch, torch_fl
        torch_fl.register_device_plugin(name="sim")
        x = torch.ones(2, 3).to("sim")
        print(x.device)   # sim:0
    """
    priority, expected = _check_arguments(name, plugin_path, priority, metadata)
    # First: in a forked child of a process that had initialized a plugin,
    # discovery and loading would call into it.
    _native.check_not_forked(f"register the device {name!r}")
    # Refused before anything is loaded: a plugin would be initialized for
    # nothing.
    _native.check_device_name(name)
    if _native.bound_device_name() is None and _lazy_device.pending_device() != name:
        _check_name_is_free(name)
    _check_allocator_settings()
    # Loading runs the plugin's own code (initializers, initialize), which
    # may be slow or never return: on a watched thread, bounded by
    # TORCH_FL_INIT_TIMEOUT and interruptible with Ctrl-C, and outside the
    # lock, so that other registrations are not blocked by it.
    if plugin_path is not None:
        plugin = _native.load_plugin(os.fspath(plugin_path))
        origin = str(plugin_path)
    else:
        plugin, origin = _native.find_plugin(name, candidates=plugins.discovery_candidates(name))
        if priority is None:
            packaged = plugins.packaged_plugins(name)
            priority = next((p.priority for p in packaged if origin == plugins.describe(p)), 0)
    priority = 0 if priority is None else priority
    with _lock:
        # Another thread may have named the device since the checks above.
        _native.check_device_name(name)
        if _native.bound_device_name() is None and _lazy_device.pending_device() != name:
            _check_name_is_free(name)
        newly_bound = all(bound.label != plugin.label for bound in _native.bound_plugins())
        created, outcomes = _native.bind_device(name, plugin, priority, torch.__version__, expected)
        if created:
            _install_torch_device(name, plugin)
            composites.install()
            _exit.install()
            device_trace.start_environment_trace()
    operators.wire_plugin_autograd(plugin)
    if newly_bound:
        _warn(plugin, outcomes)
    return PluginHandle(device=name, plugin=plugin, origin=origin, priority=priority, registrations=dict(outcomes))


def _check_allocator_settings() -> None:
    """Refuses an invalid ``TORCH_FL_ALLOC_CONF`` now rather than at the first allocation."""
    try:
        _C.allocator_backend()
    except RuntimeError as error:
        raise InvalidSettingError(str(error)) from None


_PRIORITY_RANGE = (-(2**31), 2**31 - 1)


def _check_arguments(
    name: object, plugin_path: object, priority: object, metadata: object
) -> tuple[int | None, dict[str, str] | None]:
    """Refuses mistyped or out-of-range arguments before anything is loaded.

    Returns the priority and the metadata as the core takes them (strings).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str such as 'ascend', not {type(name).__name__}")
    if plugin_path is not None and not isinstance(plugin_path, (str, os.PathLike)):
        raise TypeError(
            f"plugin_path must be a str or os.PathLike naming the plugin's shared library, or None to "
            f"discover it by name, not {type(plugin_path).__name__}"
        )
    # bool is an int subclass, but priority=True is a mistake, not 1.
    if priority is None:
        pass
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int (higher wins), not {type(priority).__name__}")
    low, high = _PRIORITY_RANGE
    if priority is not None and not low <= priority <= high:
        raise ValueError(
            f"priority must be between {low} and {high} (a 32-bit signed integer; higher wins), got {priority}"
        )
    if metadata is None:
        return priority, None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping such as {{'vendor': 'Acme'}}, not {type(metadata).__name__}")
    expected: dict[str, str] = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, not {type(key).__name__} ({key!r})")
        if key not in _native.METADATA_KEYS:
            # The class the core raises for a key it does not know (a
            # ValueError), raised before a plugin is initialized for nothing.
            raise MetadataMismatchError(
                f"metadata key {key!r} is not one a plugin reports: the known keys are "
                f"{', '.join(_native.METADATA_KEYS)}"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"metadata[{key!r}] must be a str (or a number for versions), not {type(value).__name__}")
        expected[key] = str(value)
    return priority, expected


def _warn(plugin: _native.Plugin, outcomes: list[tuple[str, str]]) -> None:
    """Shows what the plugin registered without, once, as PluginWarning.

    The plugin's own validation warnings carry the words ``torchfl-abi
    verify`` fails with; whether PyTorch has an ATen operator is asked of the
    installed PyTorch (the shim's outcome) rather than of the operator list
    the core was built with, which may be another release's.
    """
    messages = [message for _stage, kind, message in plugin.warnings if kind != "unknown_aten_operator"]
    messages += [
        outcome.split(": ", 1)[1] for _op, outcome in outcomes if outcome.startswith(("unknown_op", "refused"))
    ]
    for message in messages:
        warnings.warn(f"plugin {plugin.label}: {message}", PluginWarning, stacklevel=3)

"""Opt-in runtime migration: run code that hard-codes CUDA on a plugin device.

For code you cannot edit (a third-party training script, a library), in the
spirit of torch_npu's ``transfer_to_npu`` but explicit and honest::

    import torch_fl

    torch_fl.register_device_plugin(name="sim")
    with torch_fl.migrate("sim"):            # or: m = torch_fl.migrate("sim") ... m.undo()
        run_third_party_training()           # its "cuda" tensors and torch.cuda calls go to sim
    print(torch_fl.migration_stats())        # {"Tensor.cuda": 12, "torch.cuda.synchronize": 3, ...}

* Nothing changes until :func:`migrate` is called, and :meth:`Migration.undo`
  (or leaving the ``with`` block) restores every patched attribute.
* Every redirected call is counted (:func:`migration_stats`).
* ``torch.cuda.is_available()``, ``device_count()`` and ``is_initialized()``,
  and ``Tensor.is_cuda``, keep telling the truth about CUDA unless the caller
  passes ``report_cuda_available=True``: code that checks for CUDA and falls
  back to the CPU then takes its CUDA branch on the plugin device.

PyTorch parses device strings in C++ (``torch.device("cuda")`` cannot be
intercepted without replacing the ``torch.device`` type, which would break
``isinstance`` checks throughout PyTorch), so migration patches the
Python-level entry points where a device is chosen; a ``torch.device("cuda")``
object is mapped when it reaches one of them. Covered: ``Tensor.to``,
``Tensor.cuda``, ``Tensor.new_*``, ``Module.to``, ``Module.cuda``, the
``device=`` of torch's factory functions, ``torch.set_default_device``,
``torch.cuda.*`` functions the plugin's device module provides (streams,
events, memory, random state, synchronize, device selection),
``torch.autocast``/``torch.amp.autocast`` (and ``torch.cuda.amp.autocast``)
with ``device_type="cuda"``, ``torch.amp.GradScaler`` (whose default device
is CUDA) and ``torch.cuda.amp.GradScaler``, ``torch.load``'s
``map_location`` (including checkpoints saved on CUDA, with no
``map_location``) and ``DataLoader(pin_memory_device="cuda")``. PyTorch's
own calls into ``torch.cuda`` (``torch.manual_seed`` seeding CUDA, ``GradScaler``
asking whether CUDA is available) keep CUDA's behaviour. Not covered:
names bound before :func:`migrate` (``from torch.cuda import synchronize``
executed earlier keeps the original; call :func:`migrate` before importing
the code), device strings used from C++ extensions or TorchScript, the
``torch.device`` objects themselves (``x.device == torch.device("cuda")`` is
False), ``init_process_group(backend="nccl")``, ``torch.backends.cudnn``
flags (harmless elsewhere), CUDA graphs and CUDA kernels (Triton, custom
extensions). ``torch_fl check`` finds those statically.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import torch

_F = TypeVar("_F", bound=Callable[..., Any])
_CUDA = re.compile(r"cuda(:\d+)?")
#: torch.cuda queries about CUDA itself: left alone unless report_cuda_available=True.
_AVAILABILITY = ("is_available", "device_count", "is_initialized")
_FACTORIES = (
    "tensor as_tensor zeros ones empty full rand randn randint randperm arange linspace logspace eye "
    "zeros_like ones_like empty_like full_like rand_like randn_like randint_like empty_strided"
).split()
_TENSOR_NEW = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full")

_lock = threading.Lock()
_stats: Counter[str] = Counter()
_active: Migration | None = None


def migration_stats() -> dict[str, int]:
    """How many calls each migrated entry point redirected, e.g. ``{"Tensor.cuda": 4}``.

    Counts accumulate across migrations; :func:`reset_migration_stats` clears them.
    """
    with _lock:
        return dict(_stats)


def reset_migration_stats() -> None:
    """Clear the counts :func:`migration_stats` returns."""
    with _lock:
        _stats.clear()


def _count(name: str) -> None:
    with _lock:
        _stats[name] += 1


class Migration:
    """An active migration of CUDA code to a plugin device; undo it with :meth:`undo` or ``with``.

    Created by :func:`migrate`.
    """

    def __init__(self, device: str, report_cuda_available: bool) -> None:
        self._device = device
        self._report_cuda_available = report_cuda_available
        self._saved: list[tuple[object, str, bool, object]] = []
        self._active = False

    @property
    def device(self) -> str:
        """The plugin device CUDA is mapped to, e.g. ``"sim"``."""
        return self._device

    @property
    def active(self) -> bool:
        """Whether the patches are in place."""
        return self._active

    # -- mapping -----------------------------------------------------------------------------------

    def map_device(self, value: object) -> tuple[object, bool]:
        """``value`` with CUDA replaced by the plugin device, and whether it changed.

        Handles ``"cuda"``, ``"cuda:N"`` and ``torch.device("cuda", N)``; anything else is returned as is.
        """
        if isinstance(value, str) and _CUDA.fullmatch(value):
            return self._device + value[len("cuda") :], True
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device(self._device, value.index), True
        return value, False

    def _map_call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], positional: int | None
    ) -> tuple[Any, ...]:
        """Maps ``kwargs["device"]`` and ``args[positional]`` in place (args returned); counts a change."""
        changed = False
        if "device" in kwargs:
            kwargs["device"], changed = self.map_device(kwargs["device"])
        if positional is not None and len(args) > positional:
            mapped, hit = self.map_device(args[positional])
            if hit:
                args = (*args[:positional], mapped, *args[positional + 1 :])
                changed = True
        if changed:
            _count(name)
        return args

    def _target(self, device: object) -> torch.device:
        """Where ``.cuda(device)`` goes: None is the current plugin device, an int an index."""
        if device is None:
            return torch.device(self._device)
        if isinstance(device, int):
            return torch.device(self._device, device)
        mapped, _ = self.map_device(device)
        return mapped if isinstance(mapped, torch.device) else torch.device(str(mapped))

    # -- patching ----------------------------------------------------------------------------------

    def _patch(self, owner: object, name: str, value: object) -> None:
        own = vars(owner) if isinstance(owner, type) else owner.__dict__
        had = name in own
        self._saved.append((owner, name, had, own.get(name)))
        setattr(owner, name, value)

    def undo(self) -> None:
        """Restore every patched attribute; the counts stay. Safe to call twice."""
        global _active
        with _lock:
            for owner, name, had, original in reversed(self._saved):
                if had:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)
            self._saved.clear()
            self._active = False
            if _active is self:
                _active = None

    def __enter__(self) -> Migration:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.undo()

    def _install(self) -> None:
        try:
            self._install_tensor_and_module()
            self._install_factories()
            self._install_cuda_module()
            self._install_amp()
            self._install_loading()
        except BaseException:
            self.undo()
            raise
        self._active = True

    def _wrap(self, owner: object, attr: str, label: str, positional: int | None) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args = self._map_call(label, args, kwargs, positional)
            return original(*args, **kwargs)

        self._patch(owner, attr, wrapper)

    def _install_tensor_and_module(self) -> None:
        # Positional 1: args[0] is self.
        self._wrap(torch.Tensor, "to", "Tensor.to", 1)
        self._wrap(torch.nn.Module, "to", "Module.to", 1)
        for name in _TENSOR_NEW:
            self._wrap(torch.Tensor, name, f"Tensor.{name}", None)
        tensor_to = torch.Tensor.to
        module_to = torch.nn.Module.to

        def tensor_cuda(
            tensor: torch.Tensor,
            device: object = None,
            non_blocking: bool = False,
            memory_format: torch.memory_format = torch.preserve_format,
        ) -> torch.Tensor:
            _count("Tensor.cuda")
            return tensor_to(tensor, self._target(device), non_blocking=non_blocking, memory_format=memory_format)

        def module_cuda(module: torch.nn.Module, device: object = None) -> torch.nn.Module:
            _count("Module.cuda")
            return module_to(module, self._target(device))

        self._patch(torch.Tensor, "cuda", tensor_cuda)
        self._patch(torch.nn.Module, "cuda", module_cuda)
        if self._report_cuda_available:
            device = self._device

            def is_cuda(tensor: torch.Tensor) -> bool:
                on_plugin = tensor.device.type == device
                if on_plugin:
                    _count("Tensor.is_cuda")
                return on_plugin or tensor.device.type == "cuda"

            self._patch(torch.Tensor, "is_cuda", property(is_cuda))

    def _install_factories(self) -> None:
        for name in _FACTORIES:
            self._wrap(torch, name, f"torch.{name}", None)
        self._wrap(torch, "set_default_device", "torch.set_default_device", 0)

    def _install_cuda_module(self) -> None:
        module = getattr(torch, self._device)
        for name in getattr(module, "__all__", ()):
            if not hasattr(torch.cuda, name) or (name in _AVAILABILITY and not self._report_cuda_available):
                continue
            replacement = getattr(module, name)
            if not callable(replacement):
                continue
            original = getattr(torch.cuda, name)
            self._patch(torch.cuda, name, _redirected(f"torch.cuda.{name}", original, replacement))

    def _install_amp(self) -> None:
        autocast_init = torch.amp.autocast.__init__
        scaler_init = torch.amp.GradScaler.__init__
        migration = self

        # torch.autocast is torch.amp.autocast; torch.cuda.amp.autocast and GradScaler subclass these
        # and pass "cuda" to them, so patching the two bases covers all five spellings.
        def autocast(obj: torch.amp.autocast, *args: Any, **kwargs: Any) -> None:
            if "device_type" in kwargs:
                kwargs["device_type"], changed = migration.map_device(kwargs["device_type"])
            elif args:
                first, changed = migration.map_device(args[0])
                args = (first, *args[1:])
            else:
                changed = False
            if changed:
                _count("torch.autocast(device_type='cuda')")
            autocast_init(obj, *args, **kwargs)

        def grad_scaler(obj: torch.amp.GradScaler, *args: Any, **kwargs: Any) -> None:
            if "device" in kwargs:
                kwargs["device"], changed = migration.map_device(kwargs["device"])
            elif args:
                first, changed = migration.map_device(args[0])
                args = (first, *args[1:])
            else:  # GradScaler's default device is "cuda"
                kwargs["device"], changed = migration.device, True
            if changed:
                _count("torch.amp.GradScaler('cuda')")
            scaler_init(obj, *args, **kwargs)

        self._patch(torch.amp.autocast, "__init__", functools.wraps(autocast_init)(autocast))
        self._patch(torch.amp.GradScaler, "__init__", functools.wraps(scaler_init)(grad_scaler))

    def _install_loading(self) -> None:
        load = torch.load
        device = self._device

        def restore_cuda(storage: Any, location: str) -> Any:
            if location.startswith("cuda"):
                _count("torch.load(cuda storage)")
                location = device + location[len("cuda") :]
            return torch.serialization.default_restore_location(storage, location)

        @functools.wraps(load)
        def migrated_load(*args: Any, **kwargs: Any) -> Any:
            if len(args) > 1:
                kwargs["map_location"], args = args[1], args[:1]
            location = kwargs.get("map_location")
            if location is None:
                kwargs["map_location"] = restore_cuda
            else:
                kwargs["map_location"], changed = self.map_device(location)
                if changed:
                    _count("torch.load(map_location='cuda')")
            return load(*args, **kwargs)

        self._patch(torch, "load", migrated_load)
        loader_init = torch.utils.data.DataLoader.__init__

        @functools.wraps(loader_init)
        def migrated_loader_init(loader: Any, *args: Any, **kwargs: Any) -> None:
            if "pin_memory_device" in kwargs:
                kwargs["pin_memory_device"], changed = self.map_device(kwargs["pin_memory_device"])
                if changed:
                    _count("DataLoader(pin_memory_device='cuda')")
            loader_init(loader, *args, **kwargs)

        self._patch(torch.utils.data.DataLoader, "__init__", migrated_loader_init)


def _redirected(name: str, original: _F, replacement: Callable[..., Any]) -> _F:
    """``replacement`` for user code; PyTorch's own calls keep ``original``.

    PyTorch calls torch.cuda itself (``torch.manual_seed`` seeds CUDA lazily,
    ``GradScaler`` and the DataLoader ask whether CUDA is available) and means
    CUDA there; redirecting those would double-seed the plugin, inflate the
    counts and, with ``report_cuda_available``, send PyTorch down CUDA-only paths.
    """

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "torch" or caller.startswith("torch."):
            return original(*args, **kwargs)
        _count(name)
        return replacement(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def migrate(device: str = "sim", *, report_cuda_available: bool = False) -> Migration:
    """Redirect ``torch.cuda`` calls and "cuda" devices to the registered plugin ``device``.

    Nothing is patched before this call; the returned :class:`Migration` undoes
    it (``.undo()``, or use it as a context manager). See the module docstring
    for what is covered and what cannot be.

    Args:
        device: A registered torch-fl device (:func:`torch_fl.register_device_plugin`).
        report_cuda_available: Also answer ``torch.cuda.is_available()``,
            ``device_count()``, ``is_initialized()`` and ``Tensor.is_cuda`` for
            the plugin device, so code that checks for CUDA takes its CUDA path.
            Off by default: those keep telling the truth about CUDA.

    Raises:
        ValueError: ``device`` is not the registered plugin device.
        RuntimeError: A migration is already active.
    """
    global _active
    registered = torch._C._get_privateuse1_backend_name()
    if device != registered or not hasattr(torch, device):
        raise ValueError(
            f"torch_fl.migrate({device!r}): no torch-fl device of that name is registered (registered: "
            f"{registered!r}); call torch_fl.register_device_plugin(name={device!r}) first"
        )
    with _lock:
        if _active is not None:
            raise RuntimeError(f"torch_fl.migrate: a migration to {_active.device!r} is already active; undo it first")
        migration = Migration(device, report_cuda_available)
        _active = migration
    try:
        migration._install()
    except BaseException:
        with _lock:
            _active = None
        raise
    return migration

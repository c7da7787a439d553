"""The device module PyTorch exposes as ``torch.<name>`` (``torch.sim``).

It offers the names users know from ``torch.cuda``. PyTorch itself calls
into it: ``torch.accelerator.is_available()`` and ``device_count()``
delegate here, ``torch.load`` validates devices with it, ``torch.autocast``
asks it for the supported dtypes, and ``torch.manual_seed`` seeds every
device through ``manual_seed_all``. Everything is implemented on PyTorch's
own accelerator API, which the C++ shim backs with the plugin, so this
module holds no state of its own.

Functions here must not call their ``torch.accelerator`` twins where those
delegate back to this module (``is_available``, ``device_count``): they use
the C++ hooks directly instead.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Union

import torch

DeviceLike = Union[torch.device, str, int, None]


def make_device_module(name: str, amp_dtypes: list[torch.dtype]) -> types.ModuleType:
    """Builds ``torch.<name>`` for the device ``name``."""
    module = types.ModuleType(f"torch.{name}", f"The torch-fl device '{name}' (torch.{name}).")

    def _index(device: DeviceLike, optional: bool = True) -> int:
        if device is None:
            if optional:
                return current_device()
            raise ValueError(f"a {name} device is required")
        if isinstance(device, int):
            return device
        dev = torch.device(device)
        if dev.type != name:
            raise ValueError(f"expected a {name} device, got {dev}")
        return current_device() if dev.index is None else dev.index

    def is_available() -> bool:
        """Whether the device has at least one usable device."""
        return device_count() > 0

    def device_count() -> int:
        """The number of devices."""
        return int(torch._C._accelerator_hooks_device_count())

    def current_device() -> int:
        """The index of the current device of this thread."""
        return int(torch._C._accelerator_hooks_get_current_device())

    def set_device(device: DeviceLike) -> None:
        """Makes ``device`` the current device of this thread."""
        torch._C._accelerator_hooks_set_current_device(_index(device))

    class device:  # lowercase: the name PyTorch looks for
        """Context manager that makes ``device`` current, then restores."""

        def __init__(self, device: DeviceLike) -> None:
            self.idx = _index(device)
            self.prev_idx = -1

        def __enter__(self) -> None:
            self.prev_idx = int(torch._C._accelerator_hooks_exchange_device(self.idx))

        def __exit__(self, *exc: object) -> None:
            torch._C._accelerator_hooks_maybe_exchange_device(self.prev_idx)

    def synchronize(device: DeviceLike = None) -> None:
        """Waits for all work on ``device`` (default: the current one)."""
        torch.accelerator.synchronize(_index(device))

    def Stream(device: DeviceLike = None, priority: int = 0) -> torch.Stream:
        """A new stream on ``device`` (default: the current one): a ``torch.Stream``."""
        return torch.Stream(device=torch.device(name, _index(device)), priority=priority)

    def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        """A new event of the current device: a ``torch.Event``.

        A factory rather than a subclass: PyTorch's event methods require
        exactly ``torch.Event`` for the other event.
        """
        return torch.Event(
            device=torch.device(name, current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def current_stream(device: DeviceLike = None) -> torch.Stream:
        """The current stream of ``device`` on this thread."""
        return torch.accelerator.current_stream(_index(device))

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

    def memory_allocated(device: DeviceLike = None) -> int:
        """Bytes held by tensors on ``device``."""
        return torch.accelerator.memory_allocated(_index(device))

    def max_memory_allocated(device: DeviceLike = None) -> int:
        """Peak of :func:`memory_allocated` since the last reset."""
        return torch.accelerator.max_memory_allocated(_index(device))

    def memory_reserved(device: DeviceLike = None) -> int:
        """Bytes the plugin's allocator holds on ``device``."""
        return torch.accelerator.memory_reserved(_index(device))

    def memory_stats(device: DeviceLike = None) -> dict[str, Any]:
        """Allocator statistics of ``device``, in ``torch.cuda.memory_stats`` form."""
        return torch.accelerator.memory_stats(_index(device))

    def reset_peak_memory_stats(device: DeviceLike = None) -> None:
        """Resets the peaks reported by :func:`memory_stats`."""
        torch.accelerator.reset_peak_memory_stats(_index(device))

    def empty_cache() -> None:
        """Returns cached, unused device memory to the plugin."""
        torch.accelerator.empty_cache()

    def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
        """``(free, total)`` bytes of ``device``."""
        free, total = torch.accelerator.get_memory_info(_index(device))
        return int(free), int(total)

    def _generator(idx: int) -> torch.Generator:
        return torch._C._accelerator_getDefaultGenerator(idx)

    def manual_seed(seed: int) -> None:
        """Seeds the current device's default generator."""
        _generator(current_device()).manual_seed(int(seed))

    def manual_seed_all(seed: int) -> None:
        """Seeds every device's default generator (``torch.manual_seed`` calls this)."""
        for idx in range(device_count()):
            _generator(idx).manual_seed(int(seed))

    def seed() -> None:
        """Seeds the current device's generator with a random number."""
        _generator(current_device()).seed()

    def initial_seed() -> int:
        """The current device's generator seed."""
        return int(_generator(current_device()).initial_seed())

    def get_rng_state(device: DeviceLike = "current") -> torch.Tensor:
        """The state of ``device``'s default generator (a CPU uint8 tensor)."""
        idx = current_device() if device == "current" else _index(device)
        return _generator(idx).get_state()

    def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "current") -> None:
        """Restores a state from :func:`get_rng_state`."""
        idx = current_device() if device == "current" else _index(device)
        _generator(idx).set_state(new_state)

    def get_amp_supported_dtype() -> list[torch.dtype]:
        """The lower-precision dtypes ``torch.autocast(device_type=name)`` may use."""
        return list(amp_dtypes)

    def is_initialized() -> bool:
        """Always true: the plugin is initialized when it is registered."""
        return True

    def _is_in_bad_fork() -> bool:
        # The plugin's threads do not survive fork(); PyTorch asks this
        # before touching device state in a forked child.
        return False

    def _lazy_init() -> None:
        """Nothing to do: registration initialized the plugin."""

    exported = {
        "is_available": is_available,
        "device_count": device_count,
        "current_device": current_device,
        "set_device": set_device,
        "device": device,
        "synchronize": synchronize,
        "Stream": Stream,
        "Event": Event,
        "stream": stream,
        "current_stream": current_stream,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "memory_stats": memory_stats,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "empty_cache": empty_cache,
        "mem_get_info": mem_get_info,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "seed": seed,
        "initial_seed": initial_seed,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_amp_supported_dtype": get_amp_supported_dtype,
        "is_initialized": is_initialized,
        "_is_in_bad_fork": _is_in_bad_fork,
        "_lazy_init": _lazy_init,
    }
    for attr, value in exported.items():
        value.__qualname__ = attr
        value.__module__ = module.__name__
        setattr(module, attr, value)
    module.__all__ = [k for k in exported if not k.startswith("_")]
    return module

"""Random state of the device module: the devices' default generators.

The generators live in the C++ shim (one Philox generator per device);
``torch.manual_seed`` reaches them through :func:`manual_seed_all`.
"""

from __future__ import annotations

import torch

from ._index import DeviceLike, current_device, device_index


def _generator(idx: int) -> torch.Generator:
    return torch._C._accelerator_getDefaultGenerator(idx)


def _count() -> int:
    return int(torch._C._accelerator_hooks_device_count())


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    _generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (``torch.manual_seed`` calls this)."""
    for idx in range(_count()):
        _generator(idx).manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a random number."""
    _generator(current_device()).seed()


def initial_seed() -> int:
    """The current device's generator seed."""
    return int(_generator(current_device()).initial_seed())


def get_rng_state(device: DeviceLike = "current") -> torch.Tensor:
    """The state of ``device``'s default generator (a CPU uint8 tensor)."""
    idx = current_device() if device == "current" else device_index(device)
    return _generator(idx).get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "current") -> None:
    """Restores a state from :func:`get_rng_state`."""
    idx = current_device() if device == "current" else device_index(device)
    _generator(idx).set_state(new_state)

"""Random state of the device module: the devices' default generators.

The generators live in the C++ shim (one Philox generator per device);
``torch.manual_seed`` reaches them through :func:`manual_seed_all`,
``torch.random.fork_rng(device_type=<name>)`` through :func:`get_rng_state`
and :func:`set_rng_state`. The functions follow ``torch.cuda.random``,
except that the device is initialized at registration, so nothing is
deferred.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .. import _C
from ._index import DeviceLike, current_device, device_index


def _generator(idx: int) -> torch.Generator:
    # torch 2.13 has no Python access to a PrivateUse1 default generator;
    # the shim hands out the same object _accelerator_getDefaultGenerator
    # returns on newer releases.
    get = getattr(torch._C, "_accelerator_getDefaultGenerator", None)
    return get(idx) if get is not None else _C.default_generator(idx)


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


def seed_all() -> None:
    """Seeds every device's generator with one random number, the same for all, as CUDA does."""
    count = _count()
    if count == 0:
        return
    first = _generator(0)
    first.seed()
    for idx in range(1, count):
        _generator(idx).manual_seed(first.initial_seed())


def initial_seed() -> int:
    """The current device's generator seed."""
    return int(_generator(current_device()).initial_seed())


def get_rng_state(device: DeviceLike = None) -> torch.Tensor:
    """The state of ``device``'s default generator (default: the current device), a CPU uint8 tensor."""
    return _generator(device_index(device)).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """The states of every device's default generator, in device order."""
    return [get_rng_state(idx) for idx in range(_count())]


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = None) -> None:
    """Restores a state from :func:`get_rng_state` on ``device`` (default: the current device)."""
    _generator(device_index(device)).set_state(new_state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restores the states from :func:`get_rng_state_all`: the i-th state on device i."""
    for idx, state in enumerate(new_states):
        set_rng_state(state, idx)

"""Initialization state and fork safety: ``init``, ``is_initialized``, ``_lazy_init``, ``_is_in_bad_fork``.

CUDA initializes lazily, at the first device use; torch-fl initializes the
plugin when it is registered (the Rust core calls its ``initialize``), so
nothing is left to do lazily. What remains of CUDA's protocol is its fork
rule: a child forked (``os.fork()``, multiprocessing's "fork" start method)
from a process that had initialized the device must not use it, since the
plugin's threads and device state do not survive ``fork()``. Such a child
is *in a bad fork*; any device use there raises, naming the remedy (the
"spawn" or "forkserver" start method) instead of hanging.

Three layers refuse it, each for the paths that reach it: the Rust core
(plugin calls it makes: loading, registration, ``Plugin.synchronize``,
...), the C++ shim (operators, memory, copies, streams, events, generators)
and this module (PyTorch's ``device_lazy_init`` calls :func:`_lazy_init`
before Python factories and ``.to()`` with the device, again in a forked
child). The Rust core's ``pthread_atfork`` handler is the record this module
reads: it sees every fork, including those Python's ``os.register_at_fork``
misses (a C extension calling ``fork()``).

``torch.manual_seed`` skips a device whose module reports
:func:`_is_in_bad_fork`, which is what lets DataLoader workers forked from a
process that uses the device seed their CPU generators.
"""

from __future__ import annotations

import torch

from .. import _native
from ..errors import TorchIntegrationError


def _is_in_bad_fork() -> bool:
    """Whether this process was forked from one that had initialized the device.

    Such a process must not use the device (PyTorch asks this before
    seeding the device in ``torch.manual_seed``).
    """
    return _native.in_bad_fork()


def is_initialized() -> bool:
    """Whether the device is initialized and usable in this process.

    True once a plugin is registered; False before, and in a forked child
    of a process that had initialized it (as ``torch.cuda.is_initialized``).
    """
    return _native.plugin_initialized() and _native.bound_device_name() is not None


def _lazy_init() -> None:
    """Checks that this process may use the device; PyTorch calls it before device factories and ``.to()``.

    Raises:
        torch_fl.BadForkError: in a child forked from a process that had
            initialized the device.
        torch_fl.TorchIntegrationError: no device is registered yet.
    """
    name = torch._C._get_privateuse1_backend_name()
    _native.check_not_forked(f"use the '{name}' device")
    if _native.bound_device_name() is None:
        raise TorchIntegrationError(
            "no torch-fl device is registered in this process: call torch_fl.register_device_plugin(name=...) first"
        )


def init() -> None:
    """Initializes the device: nothing is left to do after registration, but in a forked child this raises.

    Raises:
        torch_fl.BadForkError: in a child forked from a process that had
            initialized the device: use the "spawn" or "forkserver" start
            method instead.
    """
    _lazy_init()

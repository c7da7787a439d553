"""``torch.distributed`` on torch-fl devices: the ``"tfl"`` process-group backend.

Registering a device (``torch_fl.register_device_plugin(name="sim")``) also
registers the c10d backend ``"tfl"`` for it, as the default backend of the
device type, so CUDA-style code runs unchanged but for the device string::

    dist.init_process_group(device_id=torch.device("sim", local_rank))  # "tfl" for sim, nothing for cpu
    dist.init_process_group("cpu:gloo,sim:tfl", device_id=...)            # explicit pairs
    dist.init_process_group("tfl")                                        # tfl for sim and cpu tensors

``torchrun`` works as with NCCL, on one host or several. DistributedDataParallel,
FSDP2 (``fully_shard`` with a ``DeviceMesh("sim", ...)``), functional
collectives, object collectives, ``new_group`` and ``split_group`` run on it.

Communicators follow devices, as NCCL's do: ``device_id`` binds a group and
creates its communicator on that device at once; otherwise each collective
uses the communicator of its tensors' device, created on first use. No
``set_device`` is needed.

Two transports behind one backend:

- **native**: the plugin's collectives table (``plugin.has_collectives()``),
  enqueued on the current stream like NCCL;
- **staged**: for plugins without collectives, each collective copies its
  tensors to the host, runs on a private gloo group and copies back; it
  warns once and counts each call in :func:`torch_fl.fallback_stats` as
  ``"c10d::<op> (staged)"``.

Environment:

- ``TORCH_FL_DIST_STAGED=1`` forces the staged transport even when the
  plugin has collectives (to compare, or to work around a vendor library);
- ``TORCH_FL_DIST_CHECK=1|0``: before each collective, compare op, dtype
  and shape across ranks and raise ``ValueError`` naming the ranks that
  differ (default on for the staged transport, off for native, where
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` gives PyTorch's own checks).
- ``TORCH_FL_DIST_NONBLOCKING=1``: create the plugin's communicators
  without waiting for the other ranks (NCCL's non-blocking mode); their
  first collective waits instead.

Timeouts are the process group's (``init_process_group(timeout=...)``): a
rank that never joins, dies, or stops calling collectives makes the others
raise ``torch.distributed.DistBackendError`` instead of hanging.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import _import_hooks

__all__ = ["BACKEND_NAME", "install"]

BACKEND_NAME = "tfl"


def install(device: str) -> None:
    """Registers the ``"tfl"`` c10d backend for device type ``device`` (once torch.distributed is imported)."""
    # torch.distributed without its C++ part (builds without it) has no c10d module.
    _import_hooks.when_imported("torch.distributed.distributed_c10d", lambda c10d: _register(c10d, device))


def _register(c10d: Any, device: str) -> None:
    if BACKEND_NAME.upper() in c10d.Backend._plugins:
        return

    def creator(store: Any, rank: int, size: int, timeout: Any) -> Any:
        if not python_backends_supported():
            raise RuntimeError(
                f"torch-fl's distributed backend {BACKEND_NAME!r} needs torch 2.14 or newer: torch "
                f"{torch.__version__}'s c10d Backend cannot be subclassed from Python. Upgrade torch, or use "
                "backend='gloo' with tensors copied to the CPU"
            )
        from ._backend import TorchFLBackend  # imports gloo's bindings: only when a group is created

        return TorchFLBackend(store, rank, size, timeout, device, BACKEND_NAME)

    # The device first: it becomes the default backend of the device type
    # (init_process_group(device_id=...) and backend=None pick it); "cpu" is
    # listed so that backend="tfl" alone also serves host tensors (through
    # gloo), as "gloo" serves cuda ones. gloo stays cpu's default.
    c10d.Backend.register_backend(BACKEND_NAME, creator, devices=[device, "cpu"])


@functools.cache
def python_backends_supported() -> bool:
    """Whether this torch lets Python subclass c10d's ``Backend`` (2.14 and newer; not 2.13)."""
    from torch._C._distributed_c10d import Backend

    class _Probe(Backend):
        pass

    try:
        _Probe(0, 1)
    except TypeError:  # pybind11: "No constructor defined!"
        return False
    return True

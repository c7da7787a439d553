"""The native transport: the plugin's own collectives (ABI collectives table).

Used when the plugin reports ``has_collectives()`` and torch-fl's extension
provides ``Communicator``. A :class:`NativeComm` is one communicator on one
device; the backend keeps one per device its collectives use. Rank 0 asks
the plugin for a unique id and shares it through the store; every rank then
creates its communicator on its device, with the group's timeout (and, with
``blocking=False``, which the backend passes for
``TORCH_FL_DIST_NONBLOCKING=1``, without waiting for the other ranks to
join, as NCCL's non-blocking communicators do). Each collective is enqueued
on the current stream of the communicator's device, so it is ordered with
the surrounding kernels exactly as on CUDA with NCCL, and returns without
waiting. A watchdog thread polls the
communicator's asynchronous error and the completion of each enqueued
collective: an error, or a collective still running after the group's
timeout, aborts the communicator, and the next call raises.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from .. import _native
from ._codes import dtype_code, reduce_op

_UNIQUE_ID_KEY = "torch_fl/native/unique_id"


def available(plugin: Any) -> bool:
    """Whether the bound plugin and this build of torch-fl offer native collectives."""
    return hasattr(_native, "Communicator") and bool(getattr(plugin, "has_collectives", lambda: False)())


def _dtype(t: torch.Tensor) -> int:
    return dtype_code(t.dtype)


class NativeComm:
    """Collectives on device tensors through the plugin's communicator."""

    kind = "native"

    def __init__(
        self,
        store: Store,
        rank: int,
        size: int,
        timeout: timedelta,
        device: torch.device,
        plugin: Any,
        blocking: bool = True,
    ) -> None:
        if rank == 0:
            store.set(_UNIQUE_ID_KEY, bytes(plugin.collectives_unique_id()).hex())
        unique_id = bytes.fromhex(store.get(_UNIQUE_ID_KEY).decode())
        factory = getattr(_native, "Communicator")  # noqa: B009 - absent from builds without collectives
        self._comm: _native.Communicator = factory(
            plugin,
            unique_id,
            size,
            rank,
            device.index or 0,
            timeout_s=timeout.total_seconds(),
            blocking=blocking,
        )
        self.rank = rank
        self.size = size
        self._device = device
        self._timeout = timeout.total_seconds()
        self._error: str | None = None
        self._pending: list[tuple[Any, float]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="torch-fl-comm-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while not self._closed.wait(0.1):
            error = self._comm.async_error()
            with self._lock:
                now = time.monotonic()
                self._pending = [(e, d) for e, d in self._pending if not e.query()]
                late = any(d < now for _e, d in self._pending)
            if error is None and late:
                error = f"a collective did not complete within the timeout of {self._timeout:g} s"
            if error is not None:
                self._error = error
                self._comm.abort()
                return

    def __repr__(self) -> str:
        return f"NativeComm(rank {self.rank} of {self.size} on {self._device})"

    def _stream(self) -> int:
        return int(getattr(_native, "current_stream_handle")(self._device.index or 0))  # noqa: B009

    def _enqueued(self) -> None:
        if self._error is not None:
            raise dist.DistBackendError(
                f"torch-fl: the communicator of rank {self.rank} was aborted: {self._error}. "
                "Destroy the process group and create a new one"
            )
        event = torch.Event(device=self._device)
        # The communicator's device need not be the current one.
        event.record(torch.accelerator.current_stream(self._device))
        with self._lock:
            self._pending.append((event, time.monotonic() + self._timeout))

    def _check(self) -> None:
        if self._error is not None:
            self._enqueued()

    def all_reduce(self, tensors: list[torch.Tensor], op: int) -> None:
        self._check()
        stream = self._stream()
        self._comm.group_start()
        for t in tensors:
            self._comm.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), _dtype(t), op, stream)
        self._comm.group_end()
        self._enqueued()

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self._check()
        p = tensor.data_ptr()
        self._comm.broadcast(p, p, tensor.numel(), _dtype(tensor), root, self._stream())
        self._enqueued()

    def reduce(self, tensor: torch.Tensor, op: int, root: int) -> None:
        self._check()
        p = tensor.data_ptr()
        self._comm.reduce(p, p, tensor.numel(), _dtype(tensor), op, root, self._stream())
        self._enqueued()

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._check()
        self._comm.all_gather(inp.data_ptr(), out.data_ptr(), inp.numel(), _dtype(inp), self._stream())
        self._enqueued()

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: int) -> None:
        self._check()
        self._comm.reduce_scatter(inp.data_ptr(), out.data_ptr(), out.numel(), _dtype(out), op, self._stream())
        self._enqueued()

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
        self._check()
        stream = self._stream()
        if not in_splits and not out_splits:
            self._comm.all_to_all(inp.data_ptr(), out.data_ptr(), inp.numel() // self.size, _dtype(inp), stream)
        else:
            # Uneven splits: one send and one receive per peer, grouped (as
            # NCCL's backend does); this rank's own piece is a device copy.
            sends, recvs = inp.split(in_splits), out.split(out_splits)
            self._comm.group_start()
            for peer in range(self.size):
                if peer != self.rank:
                    piece = sends[peer]
                    self._comm.send(piece.data_ptr(), piece.numel(), _dtype(inp), peer, stream)
                    piece = recvs[peer]
                    self._comm.recv(piece.data_ptr(), piece.numel(), _dtype(out), peer, stream)
            self._comm.group_end()
            recvs[self.rank].copy_(sends[self.rank])
        self._enqueued()

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._check()
        self._comm.send(tensor.data_ptr(), tensor.numel(), _dtype(tensor), peer, self._stream())
        self._enqueued()

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._check()
        self._comm.recv(tensor.data_ptr(), tensor.numel(), _dtype(tensor), peer, self._stream())
        self._enqueued()

    def barrier(self) -> None:
        t = torch.zeros(1, device=self._device)
        self.all_reduce([t], reduce_op("SUM"))
        torch.accelerator.synchronize(self._device)

    def abort(self) -> None:
        self._closed.set()
        self._comm.abort()

    def shutdown(self) -> None:
        self._closed.set()
        self._comm.destroy()

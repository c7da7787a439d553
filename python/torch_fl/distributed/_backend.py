"""``TorchFLBackend``: the c10d backend of a torch-fl device.

A Python subclass of c10d's ``Backend`` (PyTorch's ``PyBackend``
trampoline dispatches each virtual collective to the method of the same
name), not of ``ProcessGroup``: a ``ProcessGroup`` returned by the creator
function would replace the whole group, so ``"cpu:gloo,sim:tfl"`` could not
pair it with gloo; a ``Backend`` is registered per device type inside
PyTorch's own ``ProcessGroup``, which keeps DDP's reducer, FSDP2, functional
collectives and ``DeviceMesh`` on their usual code paths.

Each c10d call is reduced to a handful of primitives (all-reduce of a list,
broadcast, reduce, all-gather into one buffer, reduce-scatter from one
buffer, all-to-all, send/recv, barrier) that both transports implement:
:class:`~._native_comm.NativeComm` (the plugin's collectives) and
:class:`~._staged.StagedComm` (host copies and gloo). Host tensors always
take gloo.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import PrefixStore, Store, _create_work_from_future

from . import _codes, _native_comm, _staged

_OP_CODES = {
    name: i
    for i, name in enumerate(("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "gather", "scatter"))
}


class _Comm(Protocol):
    kind: str

    def all_reduce(self, tensors: list[torch.Tensor], op: int) -> None: ...
    def broadcast(self, tensor: torch.Tensor, root: int) -> None: ...
    def reduce(self, tensor: torch.Tensor, op: int, root: int) -> None: ...
    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None: ...
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: int) -> None: ...
    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None: ...
    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...
    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...
    def barrier(self) -> None: ...
    def abort(self) -> None: ...
    def shutdown(self) -> None: ...


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() not in {"0", "false", "no", "off", ""}


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


class TorchFLBackend(C10dBackend):
    """The process-group backend of a torch-fl device (registered as ``"tfl"``).

    Created by ``init_process_group`` / ``new_group`` for the device type; not
    meant to be constructed directly.
    """

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta, device: str, name: str) -> None:
        super().__init__(rank, size)
        # The registered name ("tfl"), handed in so that this module does not
        # import the package that registers it.
        self._name = name
        self._rank = rank
        self._size = size
        self._device_type = device
        self._store = store
        self._timeout = timeout
        self._options = C10dBackend.Options(name, timeout)
        # Every rank must reach this point within the timeout: the host
        # group's rendezvous is where a rank that never joins is noticed.
        try:
            gloo = _staged.host_group(store, rank, size, timeout, "torch_fl/host/")
        except RuntimeError as e:
            self._broken = True
            raise dist.DistBackendError(
                f"torch-fl: rank {rank} of {size} could not connect to the other ranks within {timeout} "
                f"(a rank did not join, or died): {e}"
            ) from e
        from .. import _native

        self._plugin = next(iter(_native.bound_plugins()))
        self._host: _Comm = _staged.StagedComm(gloo, rank, size, device, self._plugin.label)
        self._native = not _flag("TORCH_FL_DIST_STAGED", "0") and _native_comm.available(self._plugin)
        # One communicator per device, as ProcessGroupNCCL keys its own: the
        # group's bound device gets its communicator eagerly
        # (eager_connect_single_device), any other device at its first
        # collective. Insertion order is creation order, the same on every
        # rank, which is the order barrier and shutdown walk them in.
        self._comms: dict[int, _native_comm.NativeComm] = {}
        self._splits: dict[tuple[str, tuple[int, ...]], TorchFLBackend] = {}
        self._bound: torch.device | None = None
        # A pre-collective exchanging shapes and dtypes costs a small host
        # round trip, cheap beside the staged copies; on the native path it
        # would serialize every collective, so it is opt-in there.
        self._check_meta = _flag("TORCH_FL_DIST_CHECK", "0" if self._native else "1")
        # NCCL's non-blocking communicators: creation does not wait for the
        # other ranks; the first collective does.
        self._blocking = not _flag("TORCH_FL_DIST_NONBLOCKING", "0")
        self._seq = 0
        # After a failed collective the transports are torn down with abort:
        # an orderly shutdown would wait for peers that are gone.
        self._broken = False

    # -- identity -------------------------------------------------------
    def getBackendName(self) -> str:  # the name PyTorch's trampoline calls
        return self._name

    # PyTorch's trampoline reads these through Python attribute lookup;
    # the inherited descriptors would call back into the trampoline forever.
    @property
    def supports_splitting(self) -> bool:
        # True also makes init_process_group(device_id=...) and new_group
        # call eager_connect_single_device, which creates the bound
        # device's communicator at once, as NCCL's eager init does.
        return True

    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_time_estimate(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def options(self) -> C10dBackend.Options:
        return self._options

    @property
    def transport(self) -> str:
        """``"native"`` (the plugin's collectives) or ``"staged"`` (host copies and gloo)."""
        return "native" if self._native else "staged"

    @property
    def communicators(self) -> dict[int, str]:
        """The device communicators created so far: device index -> a description."""
        return {index: repr(comm) for index, comm in self._comms.items()}

    # -- communicators per device ---------------------------------------
    def eager_connect_single_device(self, device: torch.device | None) -> None:
        """Creates the communicator of ``device`` now (``init_process_group(device_id=...)``, ``new_group``)."""
        if device is None or device.type != self._device_type:
            return
        self._bound = device
        # DeviceMesh makes LOCAL_RANK's device current only while the device
        # is uninitialized, which a registered plugin never is: the bound
        # device becomes current here instead, unless the process chose one,
        # so FSDP2 and other code reading the current device find the rank's.
        if torch.accelerator.current_device_index() == 0 and device.index:
            torch.accelerator.set_device_index(device.index)
        if self._native:
            index = device.index or 0
            self._run(lambda: self._device_comm(index), f"creating the communicator of {device}")

    def _device_comm(self, index: int) -> _native_comm.NativeComm:
        comm = self._comms.get(index)
        if comm is None:
            # The n-th communicator of every rank pairs with the n-th of the
            # others (NCCL's comm counter), whatever device each rank uses.
            prefix = f"torch_fl/native/{len(self._comms)}/"
            comm = _native_comm.NativeComm(
                PrefixStore(prefix, self._store),
                self._rank,
                self._size,
                self._timeout,
                torch.device(self._device_type, index),
                self._plugin,
                self._blocking,
            )
            self._comms[index] = comm
        return comm

    def _comm(self, tensors: Sequence[torch.Tensor], *others: torch.Tensor) -> _Comm:
        """The transport of a collective on ``tensors`` (and ``others``, its outputs): host tensors take gloo."""
        if not tensors or tensors[0].device.type != self._device_type:
            return self._host
        device = self._one_device(*tensors, *others)
        if not self._native or device is None:
            return self._host
        return self._device_comm(device.index or 0)

    def _one_device(self, *tensors: torch.Tensor) -> torch.device | None:
        """The one device of this type that ``tensors`` are on; raises naming them when there are several."""
        devices = {t.device for t in tensors if t.device.type == self._device_type}
        if len(devices) > 1:
            raise ValueError(
                f"torch-fl: one collective got tensors on {', '.join(sorted(str(d) for d in devices))}: a "
                "collective runs on one device (one communicator per device, as with NCCL); move its tensors to "
                "one device"
            )
        return devices.pop() if devices else None

    def _done(self, result: list[torch.Tensor]) -> dist.Work:
        devices: list[int | str | torch.device] = [d for d in {str(t.device) for t in result} if d != "cpu"]
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future(devices=devices)
        fut.set_result(result)
        return _create_work_from_future(fut)

    def _check(self, op: str, tensors: Sequence[torch.Tensor], root: int = -1, same_on_all: bool = True) -> None:
        """Compares this collective's op, dtype and shape with every rank's; raises naming the differences."""
        self._seq += 1
        if not self._check_meta:
            return
        t = tensors[0] if tensors else torch.empty(0)
        shape = list(t.shape)[:4] + [-1] * (4 - min(len(t.shape), 4))
        numel = sum(x.numel() for x in tensors) if same_on_all else -1
        mine = torch.tensor([_OP_CODES[op], _codes.DTYPE_CODES.get(t.dtype, -1), t.dim(), numel, root, *shape])
        every = torch.empty(self._size, mine.numel(), dtype=torch.int64)
        host = self._host
        assert isinstance(host, _staged.StagedComm)
        self._run(lambda: host.gloo_all_gather(every, mine), op)
        if not same_on_all:
            every[:, 3:] = -1
            every[:, 2] = -1
        if bool((every == every[0]).all()):
            return
        rows = {r: every[r].tolist() for r in range(self._size)}
        codes = {v: k for k, v in _OP_CODES.items()}
        dtypes = _codes.DTYPE_NAMES
        seen = "; ".join(
            f"rank {r}: {codes.get(row[0], '?')} of {dtypes.get(row[1], '?')}"
            + (f"{[d for d in row[5 : 5 + row[2]]]}" if row[2] >= 0 else "")
            + (f" root {row[4]}" if row[4] >= 0 else "")
            for r, row in rows.items()
        )
        raise ValueError(
            f"torch-fl: collective #{self._seq} differs across ranks ({seen}): every rank must call the same "
            "collective with tensors of the same dtype and shape"
        )

    def _run(self, fn: Callable[[], object], what: str) -> None:
        try:
            fn()
        except (ValueError, TypeError):
            raise
        except RuntimeError as e:
            self._broken = True
            raise dist.DistBackendError(
                f"torch-fl ({self._device_type}, {self.transport}): {what} failed on rank {self._rank} of "
                f"{self._size}: {e}. A rank that died, or stopped calling collectives, makes the others fail "
                "after the process group's timeout"
            ) from e

    # -- collectives ----------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        op = _codes.reduce_op_code(opts.reduceOp)
        # Before anything is exchanged with the other ranks, here and below.
        self._one_device(*tensors)
        self._check("allreduce", tensors)
        self._run(lambda: self._comm(tensors).all_reduce(tensors, op), "allreduce")
        return self._done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        root = opts.rootRank
        self._one_device(*tensors)
        self._check("broadcast", tensors, root)
        for t in tensors:
            self._run(lambda t=t: self._comm([t]).broadcast(t, root), "broadcast")  # type: ignore[misc]
        return self._done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        op, root = _codes.reduce_op_code(opts.reduceOp), opts.rootRank
        self._one_device(*tensors)
        self._check("reduce", tensors, root)
        for t in tensors:
            self._run(lambda t=t: self._comm([t]).reduce(t, op, root), "reduce")  # type: ignore[misc]
        return self._done(tensors)

    def _gather_into(self, inp: torch.Tensor) -> torch.Tensor:
        src = inp.contiguous()
        out = torch.empty((self._size, *src.shape), dtype=src.dtype, device=src.device)
        self._run(lambda: self._comm([src]).all_gather(out, src), "allgather")
        return out

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        self._one_device(*inputs, *(o for outs in outputs for o in outs))
        self._check("allgather", inputs)
        for outs, inp in zip(outputs, inputs):
            gathered = self._gather_into(inp)
            for r, o in enumerate(outs):
                o.copy_(gathered[r].view(o.shape))
        return self._done([o for outs in outputs for o in outs])

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> dist.Work:
        self._one_device(inp, out)
        self._check("allgather", [inp])
        if out.is_contiguous() and out.numel() == self._size * inp.numel():
            src = inp.contiguous()
            self._run(lambda: self._comm([src], out).all_gather(out, src), "allgather")
        else:
            out.copy_(self._gather_into(inp).view(out.shape))
        return self._done([out])

    def all_gather_single_coalesced(self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any) -> dist.Work:
        for o, i in zip(outs, inps):
            self.all_gather_single(o, i, opts)
        return self._done(outs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        # An all-gather: simpler, and the object collectives that use it are small.
        root = opts.rootRank
        self._check("gather", inputs, root)
        gathered = self._gather_into(inputs[0])
        if self._rank == root:
            for r, o in enumerate(outputs[0]):
                o.copy_(gathered[r].view(o.shape))
        return self._done(outputs[0] if outputs else [])

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        root = opts.rootRank
        out = outputs[0]
        self._check("scatter", outputs, root)
        buf = torch.empty((self._size, *out.shape), dtype=out.dtype, device=out.device)
        if self._rank == root:
            for r, t in enumerate(inputs[0]):
                buf[r].copy_(t)
        self._run(lambda: self._comm([buf]).broadcast(buf, root), "scatter")
        out.copy_(buf[self._rank])
        return self._done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        op = _codes.reduce_op_code(opts.reduceOp)
        self._one_device(*outputs, *(t for ins in inputs for t in ins))
        self._check("reduce_scatter", outputs)
        for out, ins in zip(outputs, inputs):
            flat = torch.stack([t.reshape(out.shape) for t in ins]).contiguous()
            self._reduce_scatter(out, flat, op)
        return self._done(outputs)

    def _reduce_scatter(self, out: torch.Tensor, flat: torch.Tensor, op: int) -> None:
        dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        self._run(lambda: self._comm([flat], dst).reduce_scatter(dst, flat, op), "reduce_scatter")
        if dst is not out:
            out.copy_(dst)

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> dist.Work:
        op = _codes.reduce_op_code(opts.reduceOp)
        self._one_device(inp, out)
        self._check("reduce_scatter", [out])
        self._reduce_scatter(out, inp.contiguous(), op)
        return self._done([out])

    def reduce_scatter_single_coalesced(
        self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        for o, i in zip(outs, inps):
            self.reduce_scatter_single(o, i, opts)
        return self._done(outs)

    def all_to_all_single(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> dist.Work:
        self._seq += 1
        self._one_device(inp, out)
        src = inp.contiguous()
        dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        self._run(lambda: self._comm([src], dst).all_to_all(dst, src, list(out_splits), list(in_splits)), "alltoall")
        if dst is not out:
            out.copy_(dst)
        return self._done([out])

    def alltoall(self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any) -> dist.Work:
        src = torch.cat([t.reshape(-1) for t in inps])
        dst = torch.empty(sum(o.numel() for o in outs), dtype=src.dtype, device=src.device)
        self.all_to_all_single(dst, src, [o.numel() for o in outs], [t.numel() for t in inps], opts)
        for o, piece in zip(outs, dst.split([o.numel() for o in outs])):
            o.copy_(piece.view(o.shape))
        return self._done(outs)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        for t in tensors:
            self._run(lambda t=t: self._comm([t]).send(t.contiguous(), dst, tag), "send")  # type: ignore[misc]
        return self._done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        for t in tensors:
            buf = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
            self._run(lambda b=buf: self._comm([b]).recv(b, src, tag), "recv")  # type: ignore[misc]
            if buf is not t:
                t.copy_(buf)
        return self._done(tensors)

    def barrier(self, opts: Any) -> dist.Work:
        self._run(self._host.barrier, "barrier")
        for comm in self._comms.values():
            self._run(comm.barrier, "barrier")
        return self._done([])

    # -- subgroups ------------------------------------------------------
    def split(self, store: Store, ranks: list[int], opts: C10dBackend.Options) -> TorchFLBackend:
        """The backend of a subgroup of ``ranks`` (``torch.distributed.split_group``), bound as this one is."""
        if self._rank not in ranks:
            raise ValueError(
                f"torch-fl: split_group: rank {self._rank} is in none of the split groups: list every rank in one "
                "of them (or use new_group, which ranks outside the group may call too)"
            )
        # PyTorch asks once per device type of the group ("sim" and "cpu"):
        # both get the one backend, as at init_process_group.
        key = (str(getattr(opts, "group_name", "")), tuple(ranks))
        if key not in self._splits:
            timeout = getattr(opts, "_timeout", None) or self._timeout
            child = TorchFLBackend(store, ranks.index(self._rank), len(ranks), timeout, self._device_type, self._name)
            if self._bound is not None:  # split_group keeps the parent's bound device
                child.eager_connect_single_device(self._bound)
            self._splits[key] = child
        return self._splits[key]

    def perform_nocolor_split(self, device: torch.device) -> None:
        """What ``new_group`` calls on ranks outside the new group: nothing to do, subgroups meet on their own store."""

    # -- lifetime -------------------------------------------------------
    def abort(self) -> None:
        for comm in self._comms.values():
            comm.abort()
        self._host.abort()

    def shutdown(self) -> None:
        if self._broken:
            self.abort()
            return
        for comm in self._comms.values():
            comm.shutdown()
        self._host.shutdown()

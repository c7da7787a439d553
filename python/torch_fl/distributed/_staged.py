"""The staged transport: collectives through host memory and gloo.

For plugins without a collectives table (or when ``TORCH_FL_DIST_STAGED=1``
forces it), every collective copies its device tensors to the host, runs the
same collective with a private gloo process group built on the group's own
store (under a prefix, so the keys never meet the device backend's), and
copies the results back. Each call completes before it returns: the copies
to the host wait for the device's queued work, the copies back are ordered on
the current stream like any copy.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from .. import fallback
from ._codes import REDUCE_OP_NAMES, reduce_op

# Ops gloo lacks are built from the ones it has: AVG is a SUM divided,
# reduce_scatter an all-reduce sliced.
_AVG, _PRODUCT, _MIN = reduce_op("AVG"), reduce_op("PRODUCT"), reduce_op("MIN")


def _gloo_op(op: int) -> Any:
    """The gloo operator of a reduce-op code (AVG: SUM, divided afterwards)."""
    return dist.ReduceOp.SUM if op == _AVG else getattr(dist.ReduceOp, REDUCE_OP_NAMES[op])


_warned = False


def host_group(store: Store, rank: int, size: int, timeout: timedelta, prefix: str) -> ProcessGroupGloo:
    """A gloo group of the same ranks, on ``store`` under ``prefix``; waits for every rank up to ``timeout``."""
    return ProcessGroupGloo(PrefixStore(prefix, store), rank, size, timeout)


def _warn_once(device: str, plugin: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"torch-fl: plugin {plugin} has no collectives, so torch.distributed on {device!r} stages every "
            "collective through host memory and gloo (correct, but slower than a native collective library). "
            "torch_fl.fallback_stats() counts them",
            UserWarning,
            stacklevel=4,
        )


class StagedComm:
    """Collectives on device tensors, run by gloo on host copies."""

    kind = "staged"

    def __init__(self, gloo: ProcessGroupGloo, rank: int, size: int, device: str, plugin: str) -> None:
        # Any: torch's stubs for ProcessGroupGloo omit the collectives it inherits.
        self._gloo: Any = gloo
        self.rank = rank
        self.size = size
        self._device = device
        self._plugin = plugin

    def _count(self, op: str, tensors: list[torch.Tensor]) -> None:
        if any(t.device.type == self._device for t in tensors):
            _warn_once(self._device, self._plugin)
            fallback.count_distributed(f"c10d::{op} (staged)")

    @staticmethod
    def _host(t: torch.Tensor) -> torch.Tensor:
        h = t.detach().cpu() if t.device.type != "cpu" else t.detach()
        # gloo reduces numbers: bool travels as uint8 (logical OR/AND become MAX/MIN)
        return h.to(torch.uint8) if h.dtype == torch.bool else h

    @staticmethod
    def _back(dst: torch.Tensor, host: torch.Tensor) -> None:
        if dst.data_ptr() != host.data_ptr() or dst.device != host.device:
            dst.copy_(host.to(dst.dtype) if host.dtype != dst.dtype else host)

    def _wait(self, work: dist.Work) -> None:
        work.wait()

    def all_reduce(self, tensors: list[torch.Tensor], op: int) -> None:
        """Reduces each rank's ``tensors`` (flattened together) in place."""
        self._count("allreduce", tensors)
        flat = torch.cat([self._host(t).reshape(-1) for t in tensors]) if len(tensors) > 1 else None
        host = flat if flat is not None else self._host(tensors[0])
        if op == _PRODUCT and host.dtype == torch.uint8 and tensors[0].dtype == torch.bool:
            op = _MIN
        opts = dist.AllreduceOptions()
        opts.reduceOp = _gloo_op(op)
        self._wait(self._gloo.allreduce([host], opts))
        if op == _AVG:
            host = host / self.size if host.is_floating_point() else host.div(self.size, rounding_mode="floor")
        if flat is None:
            self._back(tensors[0], host)
            return
        offset = 0
        for t in tensors:
            self._back(t, host[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self._count("broadcast", [tensor])
        host = self._host(tensor).contiguous()
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self._wait(self._gloo.broadcast([host], opts))
        self._back(tensor, host)

    def reduce(self, tensor: torch.Tensor, op: int, root: int) -> None:
        # An all-reduce: gloo's reduce leaves non-roots' buffers undefined,
        # and ours leaves them untouched.
        self._count("reduce", [tensor])
        result = tensor.detach().clone()
        self.all_reduce([result], op)
        if self.rank == root:
            tensor.copy_(result)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """``out`` (contiguous, ``size * inp.numel()`` elements) receives every rank's ``inp`` in rank order."""
        self._count("allgather", [inp])
        host_in = self._host(inp).contiguous().reshape(-1)
        host_out = torch.empty(self.size * host_in.numel(), dtype=host_in.dtype)
        self._wait(self._gloo.allgather([list(host_out.chunk(self.size))], [host_in]))
        self._back(out, host_out.view(out.shape))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: int) -> None:
        """``out`` receives this rank's chunk of ``inp`` reduced over the ranks."""
        self._count("reduce_scatter", [inp])
        full = inp.detach().clone()
        self.all_reduce([full], op)
        out.copy_(full.reshape(-1).chunk(self.size)[self.rank].view(out.shape))

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
        self._count("alltoall", [inp])
        host_in = self._host(inp).contiguous()
        host_out = torch.empty(out.shape, dtype=host_in.dtype)
        self._wait(self._gloo.alltoall_base(host_out, host_in, out_splits, in_splits, dist.AllToAllOptions()))
        self._back(out, host_out)

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._count("send", [tensor])
        self._wait(self._gloo.send([self._host(tensor).contiguous()], peer, tag))

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._count("recv", [tensor])
        host = torch.empty(tensor.shape, dtype=torch.uint8 if tensor.dtype == torch.bool else tensor.dtype)
        self._wait(self._gloo.recv([host], peer, tag))
        self._back(tensor, host)

    def gloo_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """All-gathers host tensors (``out`` holds ``size`` rows of ``inp``), uncounted: torch-fl's own checks."""
        self._wait(self._gloo.allgather([list(out.unbind(0))], [inp]))

    def barrier(self) -> None:
        self._wait(self._gloo.allreduce([torch.zeros(1)], dist.AllreduceOptions()))

    def abort(self) -> None:
        self._gloo.abort()

    def shutdown(self) -> None:
        self._gloo.shutdown()

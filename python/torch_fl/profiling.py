"""Where a workload's time goes: torch-fl's own layers versus plugin kernels.

:func:`profile_layers` answers "how much does torch-fl itself cost?" for a
block of code. While it is active, every operator entry torch-fl registers
with PyTorch (plugin kernels, and the allocation and view operators it
implements itself) times itself, and so does every plugin kernel call
inside it. *Layer time* is the entries' time minus the kernels': device
checks, call-frame building, output shape inference and allocation (the
plugin's ``allocate`` included). It does not include the kernels, PyTorch's
own dispatcher and autograd, or the CPU fallback of operators no plugin
serves. Timing costs two clock reads per operator, only while profiling::

    with torch_fl.profile_layers() as p:
        train_step()
    print(f"torch-fl layers: {p.layer_share:.2%} of {p.wall_s:.3f} s")
    for name, op in p.top_operators(3):
        print(f"{name}: {op.entries} entries, {op.layer_s / op.entries * 1e6:.1f} us each")

Each entry is also counted under its operator's name
(:attr:`LayerProfile.operators`): the layer cost of an entry depends on its
arguments and outputs, so the share is usually a handful of operators'.

With an asynchronous plugin the kernel time is the time kernel calls took
to *enqueue* their work; the block ends with a device synchronize, so
``wall_s`` covers the queued work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from . import _C


@dataclass(frozen=True)
class OperatorLayerTime:
    """One operator's share of a :class:`LayerProfile`."""

    entries: int
    """Outermost entries of this operator."""
    entry_s: float
    """Total time inside them."""
    kernel_s: float
    """Of which inside plugin kernel calls."""

    @property
    def layer_s(self) -> float:
        """Time in torch-fl's layers outside kernel calls, for this operator."""
        return max(self.entry_s - self.kernel_s, 0.0)


@dataclass
class LayerProfile:
    """What :func:`profile_layers` measured; filled in when the block ends."""

    wall_s: float = 0.0
    """Wall-clock time of the block, device work included."""
    entries: int = 0
    """Operator entries timed (outermost ones; nested entries count once)."""
    entry_s: float = 0.0
    """Total time inside those entries."""
    kernel_s: float = 0.0
    """Of which inside plugin kernel calls."""
    kernel_calls: int = 0
    """Plugin kernel calls."""
    alloc_s: float = 0.0
    """Time inside the plugin's allocate and deallocate calls (a part of :attr:`entry_s`, or of freeing tensors)."""
    alloc_calls: int = 0
    """Plugin allocate and deallocate calls: zero in a steady state under the caching allocator."""
    operators: dict[str, OperatorLayerTime] = field(default_factory=dict)
    """The entries by operator (``"aten::add.Tensor"``); their entries add up to :attr:`entries`."""

    def top_operators(self, n: int = 10) -> list[tuple[str, OperatorLayerTime]]:
        """The ``n`` operators with the most layer time, most first."""
        return sorted(self.operators.items(), key=lambda item: item[1].layer_s, reverse=True)[:n]

    @property
    def layer_s(self) -> float:
        """Time in torch-fl's layers outside kernel calls."""
        return max(self.entry_s - self.kernel_s, 0.0)

    @property
    def layer_share(self) -> float:
        """:attr:`layer_s` as a fraction of :attr:`wall_s`."""
        return self.layer_s / self.wall_s if self.wall_s > 0 else 0.0


@contextmanager
def profile_layers() -> Iterator[LayerProfile]:
    """Measure torch-fl's layer time over a ``with`` block (not re-entrant).

    Yields:
        A :class:`LayerProfile`, filled in when the block exits.
    """
    result = LayerProfile()
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()
    _C.reset_layer_profile()
    _C.set_layer_profiling(True)
    start = time.perf_counter()
    try:
        yield result
    finally:
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
        result.wall_s = time.perf_counter() - start
        _C.set_layer_profiling(False)
        counters = _C.layer_profile()
        result.entries = counters["entries"]
        result.entry_s = counters["entry_ns"] / 1e9
        result.kernel_s = counters["kernel_ns"] / 1e9
        result.kernel_calls = counters["kernel_calls"]
        result.alloc_s = counters["alloc_ns"] / 1e9
        result.alloc_calls = counters["alloc_calls"]
        result.operators = {
            row["operator"]: OperatorLayerTime(row["entries"], row["entry_ns"] / 1e9, row["kernel_ns"] / 1e9)
            for row in json.loads(_C.layer_profile_operators_json())
        }

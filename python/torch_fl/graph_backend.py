"""``torch.compile(model, backend="torchfl_graphs")``: compiled models replayed as device graphs.

The "reduce overhead" route for every plugin, host-addressable memory or
not. Dynamo captures the model, AOT autograd splits it into a forward and a
backward graph of ATen operators (as ``backend="aot_eager"`` does), and each
of those runs on the plugin's kernels through a device graph
(:class:`torch_fl.device_module.graphs.Graph`), the way Dynamo's
``cudagraphs`` backend runs CUDA graphs:

- the first call of each graph runs it eagerly on a side stream (warm-up:
  output shapes, lazy initialization) and returns that result, then
  captures it into a graph; forward and backward graphs share one memory
  pool;
- later calls copy the inputs that are not at the captured addresses into
  the graph's static inputs, replay, and return copies of the static
  outputs, so results stay valid across calls (a forward's saved
  activations included, however forward and backward calls interleave);
- parameters (and the inputs AOT autograd lifts with fixed addresses) are
  used in place; a graph recaptures when one of them moves (a
  ``load_state_dict`` that replaced tensors). Every other input, the
  forward's saved activations included, is copied in;
- with dynamic shapes, each signature (the sizes a graph is called with)
  gets a capture of its own on its first call;
- a graph whose tensor inputs are not all on the device, or whose capture
  raises (a CPU fallback, ``.item()``, a data-dependent shape), runs eagerly
  from then on, with a warning saying why.

``mode="reduce-overhead"`` is Inductor's CUDA-graph route (CUDA graph
trees) and is CUDA-only in PyTorch; this backend is its counterpart for
plugin devices, without Inductor's code generation (kernels are the
plugin's). Dynamo finds the backend by name through the package's
``torch_dynamo_backends`` entry point; passing :func:`torchfl_graphs` itself
as ``backend=`` works too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

BACKEND = "torchfl_graphs"


class _Captured:
    """One capture of an AOT graph: the device graph and its static tensors."""

    def __init__(self, graph: Any, static_inputs: list[Any], static_outputs: Sequence[Any], pinned: list[int]) -> None:
        self.graph = graph
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs
        self.pinned = pinned  # inputs used in place (parameters, fixed inputs)
        self.pinned_ptrs = [static_inputs[i].data_ptr() for i in pinned]
        self.copied = [i for i, a in enumerate(static_inputs) if i not in pinned and isinstance(a, torch.Tensor)]


class _GraphedCode:
    """One AOT graph (boxed calling convention), replayed as a device graph per input signature.

    Dynamic shapes give one AOT graph several signatures (the sizes it is
    called with, as integer inputs and tensor shapes): each gets a capture
    of its own on its first call.
    """

    def __init__(self, run: Callable[[list[Any]], Any], fixed: int, pool: tuple[int, int] | None) -> None:
        self._run = run  # boxed: takes the argument list and clears it
        self._fixed = fixed  # leading inputs AOT autograd lifted with fixed addresses
        self._pool = pool
        self._captures: dict[tuple[Any, ...], _Captured] = {}
        self._eager_reason: str | None = None

    def __call__(self, args: list[Any]) -> Any:
        if self._eager_reason is not None:
            return self._run(args)
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        c = self._captures.get(key)
        if c is not None and any(args[i].data_ptr() != ptr for i, ptr in zip(c.pinned, c.pinned_ptrs)):
            c.graph.reset()  # a parameter moved: capture again
            del self._captures[key]
            c = None
        if c is None:
            return self._warm_up_and_capture(key, args)
        for i in c.copied:
            if c.static_inputs[i].data_ptr() != args[i].data_ptr():
                c.static_inputs[i].copy_(args[i])
        args.clear()
        c.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in c.static_outputs]

    def _warm_up_and_capture(self, key: tuple[Any, ...], args: list[Any]) -> Any:
        device = _common_device(args)
        if device is None:
            return self._go_eager(args, "its tensor inputs are not all on the plugin device")
        module = getattr(torch, device.type)
        previous = module.current_stream()
        side = module.Stream()
        side.wait_stream(previous)
        with module.stream(side):
            result = self._run(list(args))
        previous.wait_stream(side)
        # Inputs the caller owns are copied into buffers of the graph's own.
        pinned = [
            i
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and (i < self._fixed or isinstance(a, torch.nn.Parameter))
        ]
        static_inputs = [
            a.clone() if isinstance(a, torch.Tensor) and i not in pinned else a for i, a in enumerate(args)
        ]
        graph = module.Graph()
        try:
            with module.graph(graph, pool=self._pool, stream=side):
                static_outputs = self._run(list(static_inputs))
        except RuntimeError as error:
            self._go_eager(None, str(error))
            args.clear()
            return result
        self._captures[key] = _Captured(graph, static_inputs, static_outputs, pinned)
        args.clear()
        return result

    def _go_eager(self, args: list[Any] | None, why: str) -> Any:
        self._eager_reason = why
        for c in self._captures.values():
            c.graph.reset()
        self._captures.clear()
        warnings.warn(
            f"torch-fl: {BACKEND}: a compiled graph runs eagerly, without a device graph: {why}", stacklevel=3
        )
        return None if args is None else self._run(args)


def _boxed(code: _GraphedCode) -> Callable[[list[Any]], Any]:
    """``code`` as a function AOT autograd calls with the boxed convention (one list, which it clears)."""

    def run(args: list[Any]) -> Any:
        return code(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _common_device(args: Sequence[Any]) -> torch.device | None:
    """The plugin device all tensors among ``args`` are on, else None (integers are sizes, part of the key)."""
    device_type = torch._C._get_privateuse1_backend_name()
    if not all(isinstance(a, (torch.Tensor, int)) for a in args):
        return None
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if len(devices) != 1:
        return None
    (device,) = devices
    return device if device.type == device_type else None


def torchfl_graphs(model: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The ``torchfl_graphs`` backend: AOT autograd over the plugin's kernels, each graph replayed as a device graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.utils import num_fw_fixed_arguments

    # One pool for the forward and backward graphs of this compiled region.
    pool: list[tuple[int, int] | None] = [None]

    def shared_pool() -> tuple[int, int] | None:
        if pool[0] is None and torch.accelerator.is_available():
            pool[0] = getattr(torch, torch._C._get_privateuse1_backend_name()).graph_pool_handle()
        return pool[0]

    def forward(aot_model: torch.fx.GraphModule, aot_inputs: list[Any]) -> Any:
        fixed = max(num_fw_fixed_arguments(len(example_inputs), len(aot_inputs)), 0)
        return _boxed(_GraphedCode(boxed_nop(aot_model, aot_inputs), fixed, shared_pool()))

    def backward(aot_model: torch.fx.GraphModule, aot_inputs: list[Any]) -> Any:
        # The saved activations come from the forward's returned copies, at
        # new addresses every call: copied in, not fixed.
        return _boxed(_GraphedCode(boxed_nop(aot_model, aot_inputs), 0, shared_pool()))

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, inference_compiler=forward)(
        model, example_inputs, **kwargs
    )

"""Device graphs of the device module, in ``torch.cuda``'s shape.

:class:`Graph`, :class:`graph`, :func:`graph_pool_handle`,
:func:`is_current_stream_capturing` and :func:`make_graphed_callables`.
Capturing records every kernel launch and device-to-device copy queued on
the capturing stream, without running them; :meth:`Graph.replay` submits the
recording again in one call, without Python, the dispatcher or torch-fl's
per-operator entry. That is what makes small, host-bound work (decoding one
token at a time, small training steps) fast, on every plugin: the shim
records the launches, so a plugin needs nothing to support it.

Replays read and write the addresses the capture saw: feed new data by
``copy_`` into the tensors the capture read (static inputs), and read the
results from the tensors it produced (static outputs), which the next replay
overwrites. Tensors allocated during capture come from the graph's private
memory pool, which stays reserved until the graph is reset or deleted.
Random operators draw fresh numbers on every replay, reproducibly after
``manual_seed``. What needs the captured work to have run cannot be
captured and raises, naming the operator: ``.item()``, printing, copies to
or from the host, host synchronization (depending on
``capture_error_mode``), CPU fallbacks and data-dependent shapes.

PyTorch's own ``torch.accelerator.Graph`` works on the device too (the same
graphs, registered with PyTorch's graph registry).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar, cast

import torch
from torch.utils import _pytree

from .. import _C
from ._index import current_device

CaptureErrorMode = Literal["default", "global", "thread_local", "relaxed"]
_Callable = TypeVar("_Callable", bound=Callable[..., Any])


def _pool_id(pool: object) -> tuple[int, int]:
    """A pool argument as an id: None, a graph_pool_handle()/pool() tuple, or a MemPool."""
    if pool is None:
        return (0, 0)
    if isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(v, int) for v in pool):
        return cast(tuple[int, int], pool)
    pool_id = getattr(pool, "id", None)
    if isinstance(pool_id, tuple):
        return cast(tuple[int, int], pool_id)
    raise TypeError(
        f"pool must be None, graph_pool_handle(), another graph's pool() or a MemPool, not {type(pool).__name__}"
    )


def graph_pool_handle() -> tuple[int, int]:
    """A memory pool id that graphs captured with ``pool=`` it share, as ``torch.cuda.graph_pool_handle``.

    Graphs sharing a pool must be replayed in the order they were captured.
    """
    return _C.graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether this thread's current stream of the current device is being captured."""
    return bool(_C.stream_is_capturing(-1))


class Graph:
    """A device graph, as ``torch.cuda.CUDAGraph``: capture once, :meth:`replay` many times.

    Example::

        g = torch.sim.Graph()
        static_x = torch.zeros(8, device="sim")
        with torch.sim.graph(g):
            static_y = static_x * 2 + 1
        static_x.copy_(torch.arange(8.0))
        g.replay()  # static_y now holds 2 * arange(8) + 1
    """

    def __init__(self, keep_graph: bool = False) -> None:
        self._graph: Any = _C.graph_new(keep_graph)

    def capture_begin(self, pool: object = None, capture_error_mode: CaptureErrorMode = "global") -> None:
        """Starts capturing the current stream of the current device.

        ``pool`` shares another graph's memory (its :meth:`pool`, a
        :func:`graph_pool_handle` or a ``MemPool``). ``capture_error_mode``
        decides which host synchronizations raise during capture:
        ``"global"`` any on any thread, ``"thread_local"`` those of this
        thread, ``"relaxed"`` only those of a captured stream.
        """
        _C.graph_capture_begin(self._graph, _pool_id(pool), capture_error_mode)

    def capture_end(self) -> None:
        """Ends the capture, on the stream it began on; instantiates unless ``keep_graph``."""
        _C.graph_capture_end(self._graph)

    def instantiate(self) -> None:
        """Makes the captured graph replayable (done by :meth:`capture_end` unless ``keep_graph``)."""
        _C.graph_instantiate(self._graph)

    def replay(self) -> None:
        """Submits the captured work on the current stream (of the graph's device), after the work queued there."""
        _C.graph_replay(self._graph)

    def reset(self) -> None:
        """Drops the captured work and the graph's use of its memory pool; the graph can capture again."""
        _C.graph_reset(self._graph)

    def pool(self) -> tuple[int, int]:
        """The id of the graph's memory pool, to share with later captures (``pool=``)."""
        return _C.graph_pool(self._graph)

    def enable_debug_mode(self) -> None:
        """Kept for ``torch.cuda.CUDAGraph``'s shape: torch-fl graphs always keep what :meth:`debug_dump` writes."""

    def debug_dump(self, debug_path: str) -> None:
        """Writes the captured kernel launches and copies to ``debug_path``, one per line."""
        _C.graph_debug_dump(self._graph, debug_path)

    @property
    def native(self) -> bool:
        """Whether a replay is one launch of the plugin's own graph (ABI 1.7 native graphs), not one call per node.

        Decided at instantiation: native where the plugin offers graphs and
        ``TORCH_FL_GRAPHS`` is not ``shim``.
        """
        return bool(_C.graph_is_native(self._graph))

    def num_nodes(self) -> int:
        """How many kernel launches and copies a replay submits."""
        return int(_C.graph_num_nodes(self._graph))


class graph:  # lowercase: torch.cuda.graph's name
    """Captures the work of a ``with`` block into ``graph``, as ``torch.cuda.graph``.

    Before capturing it synchronizes the device, collects garbage and empties
    the allocator's cache, so that the graph's pool starts clean. The block
    runs on ``stream`` (default: a side stream of the device's, shared by all
    captures), which the capture records. To share memory with earlier
    captures pass ``pool=`` (and the same ``stream``).
    """

    _side_streams: ClassVar[dict[int, torch.Stream]] = {}

    def __init__(
        self,
        graph: Graph,
        pool: object = None,
        stream: torch.Stream | None = None,
        capture_error_mode: CaptureErrorMode = "global",
    ) -> None:
        self._graph = graph
        self._pool = _pool_id(pool)
        self._mode: CaptureErrorMode = capture_error_mode
        device = current_device()
        if stream is None:
            stream = type(self)._side_streams.get(device)
            if stream is None:
                stream = torch.Stream(device=torch.device(torch._C._get_privateuse1_backend_name(), device))
                type(self)._side_streams[device] = stream
        self._stream = stream
        self._previous: torch.Stream | None = None

    def __enter__(self) -> None:
        torch.accelerator.synchronize()
        gc.collect()
        torch.accelerator.empty_cache()
        # The synchronize above ordered everything queued so far before the
        # capture, on every stream.
        self._previous = torch.accelerator.current_stream()
        torch.accelerator.set_stream(self._stream)
        try:
            self._graph.capture_begin(self._pool, capture_error_mode=self._mode)
        except BaseException:
            torch.accelerator.set_stream(self._previous)
            raise

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> Literal[False]:
        try:
            if exc_type is None:
                self._graph.capture_end()
            else:
                # The block's own error is the one to report; the capture it
                # cut short holds nothing.
                self._graph.reset()
        finally:
            assert self._previous is not None
            torch.accelerator.set_stream(self._previous)
        return False


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: object = None,
    capture_error_mode: CaptureErrorMode = "global",
) -> Any:
    """Graphed versions of modules or functions, forward and backward, as ``torch.cuda.make_graphed_callables``.

    ``callables`` is one callable or a tuple of them, ``sample_args`` its
    tuple of tensor arguments (a tuple of such tuples for several). Each
    callable runs ``num_warmup_iters`` times on a side stream, then its
    forward and its backward are captured into graphs sharing one pool. A
    graphed callable copies new inputs into the static ones, replays, and
    returns the static outputs (detached, inside an autograd function whose
    backward replays the backward graph). A module's ``forward`` is replaced,
    and the graphs serve only the ``training`` mode it had when captured.
    """
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast cache: set cache_enabled=False")
    just_one = not isinstance(callables, tuple)
    funcs: tuple[Any, ...] = (callables,) if just_one else callables
    all_args: tuple[tuple[Any, ...], ...] = (sample_args,) if just_one else sample_args
    flat_args: list[tuple[torch.Tensor, ...]] = []
    for func, args in zip(funcs, all_args):
        if isinstance(func, torch.nn.Module):
            if func._backward_hooks or func._forward_hooks or func._forward_pre_hooks:
                raise RuntimeError("modules passed to make_graphed_callables must not have hooks registered yet")
            if any(b.requires_grad for b in func.buffers()):
                raise RuntimeError("in modules passed to make_graphed_callables only parameters may require grad")
        leaves = tuple(_pytree.arg_tree_leaves(*args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError("make_graphed_callables: sample_args must contain only tensors")
        flat_args.append(leaves)
    params = [tuple(f.parameters()) if isinstance(f, torch.nn.Module) else () for f in funcs]
    surfaces = [flat_args[i] + params[i] for i in range(len(funcs))]
    mempool = graph_pool_handle() if pool is None else _pool_id(pool)

    def grads(outputs: tuple[torch.Tensor, ...], surface: tuple[torch.Tensor, ...], grad_outputs: Any) -> Any:
        return torch.autograd.grad(
            outputs=outputs,
            inputs=tuple(i for i in surface if i.requires_grad),
            grad_outputs=grad_outputs,
            only_inputs=True,
            allow_unused=allow_unused_input,
        )

    # Warm up on the capture stream, so that lazy initialization (output
    # shape inference, workspaces) happens outside the capture.
    torch.accelerator.synchronize()
    stream = torch.Stream(device=torch.device(torch._C._get_privateuse1_backend_name(), current_device()))
    previous = torch.accelerator.current_stream()
    stream.wait_stream(previous)
    torch.accelerator.set_stream(stream)
    try:
        for func, args, surface in zip(funcs, all_args, surfaces):
            for _ in range(num_warmup_iters):
                outputs = tuple(_pytree.tree_leaves(func(*args)))
                needing = tuple(o for o in outputs if o.requires_grad)
                if needing:
                    grads(needing, surface, tuple(torch.empty_like(o) for o in needing))
    finally:
        torch.accelerator.set_stream(previous)
    torch.accelerator.synchronize()

    fwd_graphs = [Graph() for _ in funcs]
    bwd_graphs = [Graph() for _ in funcs]
    static_outputs: list[tuple[torch.Tensor, ...]] = []
    specs: list[_pytree.TreeSpec] = []
    for func, args, fwd in zip(funcs, all_args, fwd_graphs):
        with graph(fwd, pool=mempool, stream=stream, capture_error_mode=capture_error_mode):
            result = func(*args)
        flat, spec = _pytree.tree_flatten(result)
        static_outputs.append(tuple(flat))
        specs.append(spec)

    # Backward graphs in reverse order, as autograd would run them, so that
    # the shared pool is used in replay order.
    static_grad_outputs: list[tuple[torch.Tensor | None, ...]] = []
    static_grad_inputs: list[tuple[torch.Tensor | None, ...]] = []
    for surface, outs, bwd in zip(reversed(surfaces), reversed(static_outputs), reversed(bwd_graphs)):
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in outs)
        needing = tuple(o for o in outs if o.requires_grad)
        grad_ins: Any = None
        if needing:
            with graph(bwd, pool=mempool, stream=stream, capture_error_mode=capture_error_mode):
                grad_ins = grads(needing, surface, tuple(g for g in grad_outs if g is not None))
        per_input: list[torch.Tensor | None] = []
        index = 0
        for arg in surface:
            if arg.requires_grad and grad_ins is not None:
                per_input.append(grad_ins[index])
                index += 1
            else:
                per_input.append(None)
        static_grad_outputs.append(grad_outs)
        static_grad_inputs.append(tuple(per_input))
    static_grad_outputs.reverse()
    static_grad_inputs.reverse()
    # The captured autograd graphs are no longer needed: kept alive through
    # the static outputs, they would tie the parameters' gradient
    # accumulators to the capture stream for every later backward.
    static_outputs = [tuple(o.detach() for o in outs) for outs in static_outputs]

    results: list[Any] = []
    for i, func in enumerate(funcs):
        graphed = _graphed_function(
            fwd_graphs[i],
            bwd_graphs[i],
            params[i],
            len(flat_args[i]),
            specs[i],
            surfaces[i],
            static_outputs[i],
            static_grad_outputs[i],
            static_grad_inputs[i],
        )
        if isinstance(func, torch.nn.Module):
            func.forward = _graphed_forward(func, func.training, graphed, func.forward)
            results.append(func)
        else:
            results.append(graphed)
    return results[0] if just_one else tuple(results)


def _graphed_function(
    fwd: Graph,
    bwd: Graph,
    module_params: tuple[torch.Tensor, ...],
    num_user_args: int,
    spec: _pytree.TreeSpec,
    surface: tuple[torch.Tensor, ...],
    outputs: tuple[torch.Tensor, ...],
    grad_outputs: tuple[torch.Tensor | None, ...],
    grad_inputs: tuple[torch.Tensor | None, ...],
) -> Callable[..., Any]:
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            for i in range(num_user_args):
                if surface[i].data_ptr() != inputs[i].data_ptr():
                    surface[i].copy_(inputs[i])
            fwd.replay()
            return tuple(o.detach() for o in outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            for static, grad in zip(grad_outputs, grads):
                if static is not None and static.data_ptr() != grad.data_ptr():
                    static.copy_(grad)
            bwd.replay()
            return tuple(g.detach() if g is not None else None for g in grad_inputs)

    def functionalized(*user_args: Any) -> Any:
        flat = tuple(_pytree.arg_tree_leaves(*user_args))
        out = Graphed.apply(*(flat + module_params))
        return _pytree.tree_unflatten(out, spec)

    return functionalized


def _graphed_forward(
    module: torch.nn.Module, training: bool, graphed: Callable[..., Any], original: _Callable
) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if module.training == training:
            return graphed(*args, **kwargs)
        return original(*args, **kwargs)

    return forward

"""``register_operator``: plugin kernels and Python functions as PyTorch operators, with autograd.

Two kinds of operator can be registered:

* **custom operators**, outside ATen (``"sim::fused_bias_gelu"``): the schema
  defines ``torch.ops.sim.fused_bias_gelu``; the forward is a plugin kernel
  or a Python function; a backward makes it differentiable
  (``torch.library.register_autograd``); a fake implementation (the
  plugin's ``infer_outputs``, a ``fake_func``, or the Python forward itself)
  lets ``torch.compile`` trace it;
* **ATen operators** (``"aten::gelu"`` or ``"gelu"``): the plugin's kernel
  serves the operator on the device, and a backward replaces PyTorch's
  derivative formula on the device only (CPU and CUDA keep theirs).

The backward convention, the same for plugin kernels and Python functions:
the backward takes one gradient per forward output, followed by the
forward's arguments, and returns one gradient per ``Tensor`` argument of the
forward, in order (``None`` for an input that needs none). For
``fused_bias_gelu(Tensor x, Tensor bias) -> Tensor`` that is
``fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)``.
A plugin whose op table has both ``ns::op`` and ``ns::op_backward`` gets
this wiring automatically when it is registered.

Whether a kernel's signature matches a schema can only be checked where the
kernel describes itself: op-table entries carry their schema, Python
functions their signature. A bare exported symbol cannot be checked; it
must follow the schema it is registered with.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch

from . import _native
from .errors import (
    DuplicateOperatorError,
    KernelSymbolError,
    OperatorArityError,
    OperatorNotFoundError,
    OperatorSchemaError,
    TorchIntegrationError,
)

__all__ = ["OperatorHandle", "register_operator"]

Kernel = Union[str, Callable[..., Any]]

_lock = threading.RLock()
_registered: dict[str, OperatorHandle] = {}
# Leaked on purpose: destroying a Library unregisters what it holds.
_libraries: dict[tuple[str, str], torch.library.Library] = {}
_NAME = re.compile(r"^(?:([A-Za-z_][A-Za-z0-9_]*)::)?([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?$")


@dataclass(frozen=True)
class _Request:
    """One register_operator call, its name split."""

    full_name: str  # "ns::name[.overload]"
    ns: str
    name: str
    overload: str
    forward_func: Kernel
    backward_func: Kernel | None
    schema_text: str | None
    fake_func: Callable[..., Any] | None

    @property
    def qualname(self) -> str:
        return f"{self.ns}::{self.name}"


@dataclass(frozen=True)
class OperatorHandle:
    """What :func:`register_operator` registered.

    Attributes:
        name: the qualified name, ``"sim::fused_bias_gelu"``.
        op: the operator overload, callable like any PyTorch operator
            (``torch.ops.sim.fused_bias_gelu.default``).
        forward: what runs it on the device (a plugin kernel or a function).
        backward: what computes its gradients, or ``None``.
        fake: what computes output metadata for tracing, or ``None``.
    """

    name: str
    op: Any
    forward: str
    backward: str | None
    fake: str | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)


def _library(ns: str, kind: str) -> torch.library.Library:
    lib = _libraries.get((ns, kind))
    if lib is None:
        lib = _libraries[(ns, kind)] = torch.library.Library(ns, kind)
    return lib


def _split_name(op_name: str) -> tuple[str, str, str]:
    match = _NAME.match(op_name)
    if match is None:
        raise OperatorSchemaError(
            f'malformed operator name {op_name!r}: expected "[namespace::]name[.overload]", '
            'e.g. "sim::fused_bias_gelu" or "aten::gelu"'
        )
    ns, name, overload = match.groups()
    return ns or "aten", name, overload or ""


def _find_schema(ns: str, name: str, overload: str) -> torch._C.FunctionSchema | None:
    try:
        return torch._C._get_schema(f"{ns}::{name}", overload)
    except RuntimeError:
        return None


def _overload(ns: str, name: str, overload: str) -> Any:
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


def _parse_schema(qualname: str, overload: str, text: str) -> tuple[torch._C.FunctionSchema, str]:
    """The parsed schema and its text without namespace (for ``Library.define``)."""
    ns = qualname.split("::")[0]
    body = text.strip()
    if "::" in body.split("(", 1)[0]:
        body = body.split("::", 1)[1]
    try:
        parsed = torch._C.parse_schema(f"{ns}::{body}")
    except RuntimeError as e:
        raise OperatorSchemaError(
            f"the schema of {qualname} does not parse: {body!r}\n{e}\n"
            'Write it as PyTorch does, e.g. "fused_bias_gelu(Tensor x, Tensor bias) -> Tensor"'
        ) from None
    if parsed.name != qualname or parsed.overload_name != overload:
        found = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
        wanted = qualname + (f".{overload}" if overload else "")
        raise OperatorSchemaError(f"the schema names {found}, but the operator being registered is {wanted}")
    return parsed, body


def _is_tensor(arg: torch._C.Argument) -> bool:
    t = arg.type
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch._C.TensorType)


def _arity(schema: torch._C.FunctionSchema) -> tuple[int, int]:
    return len(schema.arguments), len(schema.returns)


def _check_callable(func: Callable[..., Any], expected: int, what: str, qualname: str) -> None:
    """``func`` accepts ``expected`` positional arguments."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return  # builtins without a signature: trust the caller
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= expected <= len(positional):
        raise OperatorArityError(
            f"the {what} of {qualname}, {getattr(func, '__qualname__', func)!r}, takes "
            f"{len(required)}{'' if len(required) == len(positional) else f'-{len(positional)}'} positional "
            f"arguments, but the schema calls it with {expected}"
        )


def _bound_plugins() -> list[_native.Plugin]:
    plugins = _native.bound_plugins()
    if not plugins:
        raise TorchIntegrationError(
            "no plugin is registered yet: call torch_fl.register_device_plugin(name=...) before registering "
            "plugin kernels"
        )
    return plugins


def _plugin_for(reference: str) -> tuple[_native.Plugin, str | None]:
    """The plugin that has kernel ``reference``, and its op-table name when it is a table entry."""
    plugins = _bound_plugins()
    for plugin in plugins:
        if reference in plugin.ops:
            return plugin, reference
        for op, symbol in plugin.op_symbols.items():
            if symbol == reference:
                return plugin, op
    return plugins[0], None


def _register_plugin_kernel(qualname: str, overload: str, reference: str, schema_text: str | None) -> str:
    op_name = qualname + (f".{overload}" if overload else "")
    plugin, table_op = _plugin_for(reference)
    errors: list[KernelSymbolError] = []
    candidates = [plugin] if table_op is not None else _bound_plugins()
    for candidate in candidates:
        try:
            outcome = _native.register_op_kernel(candidate, op_name, reference, schema_text)
        except KernelSymbolError as e:
            errors.append(e)
            continue
        if not outcome.startswith("registered"):
            raise TorchIntegrationError(
                f"plugin kernel {reference!r} of {candidate.label} was not registered for {op_name}: {outcome} "
                "(torch-fl serves composite, view and built-in operators itself)"
            )
        return f"plugin kernel {reference!r} of {candidate.label}"
    raise errors[0]


def _table_schema(reference: str) -> tuple[str | None, torch._C.FunctionSchema | None]:
    """The op-table entry ``reference`` names, and its schema as PyTorch registered it (when it did)."""
    _, table_op = _plugin_for(reference)
    if table_op is None:
        return None, None
    return table_op, _find_schema(*_split_name(table_op))


def _check_kernel_arity(qualname: str, schema: torch._C.FunctionSchema, reference: str, role: str) -> None:
    """A table kernel's own schema agrees with ``schema`` in arguments and returns."""
    _, own = _table_schema(reference)
    if own is not None and _arity(own) != _arity(schema):
        raise OperatorArityError(
            f"the {role} kernel {reference!r} has schema {own}, with {len(own.arguments)} arguments and "
            f"{len(own.returns)} returns, but {qualname} needs {len(schema.arguments)} arguments and "
            f"{len(schema.returns)} returns ({schema})"
        )


def _backward_schema(schema: torch._C.FunctionSchema, name: str) -> str:
    grads = [f"Tensor grad_{i}" for i in range(len(schema.returns))]
    text = str(schema)
    args = text[text.index("(") + 1 : text.rindex(") ->")]
    returns = ["Tensor" for a in schema.arguments if _is_tensor(a)]
    ret = returns[0] if len(returns) == 1 else f"({', '.join(returns)})"
    return f"{name}({', '.join([*grads, args] if args else grads)}) -> {ret}"


def _check_backward_schema(qualname: str, forward: torch._C.FunctionSchema, backward: torch._C.FunctionSchema) -> None:
    n_args = len(forward.returns) + len(forward.arguments)
    n_returns = sum(1 for a in forward.arguments if _is_tensor(a))
    if _arity(backward) != (n_args, n_returns):
        raise OperatorArityError(
            f"the backward of {qualname} must take {len(forward.returns)} gradient(s) and the {len(forward.arguments)} "
            f"forward argument(s) ({n_args} in all) and return one gradient per Tensor argument ({n_returns}); "
            f"its schema {backward} has {len(backward.arguments)} arguments and {len(backward.returns)} returns"
        )


def _save_inputs(ctx: Any, inputs: Sequence[Any]) -> None:
    """Keeps the forward's arguments for the backward: tensors through autograd, the rest as they are."""
    ctx.save_for_backward(*(x for x in inputs if isinstance(x, torch.Tensor)))
    ctx.others = [None if isinstance(x, torch.Tensor) else x for x in inputs]
    ctx.is_saved = [isinstance(x, torch.Tensor) for x in inputs]


def _saved_inputs(ctx: Any) -> list[Any]:
    saved = iter(ctx.saved_tensors)
    return [next(saved) if is_saved else other for is_saved, other in zip(ctx.is_saved, ctx.others)]


def wire_autograd(op: Any, backward: Callable[..., Any], *, aten: bool = False) -> None:
    """Makes ``op`` differentiable with ``backward`` (the module's convention).

    Custom operators go through ``torch.library.register_autograd``. ATen
    operators get a kernel for ``AutogradPrivateUse1`` only, so other devices
    keep PyTorch's formula.
    """
    schema: torch._C.FunctionSchema = op._schema
    tensor_args = [_is_tensor(a) for a in schema.arguments]

    def run_backward(inputs: Sequence[Any], grads: Sequence[Any]) -> tuple[Any, ...]:
        result = backward(*grads, *inputs)
        if isinstance(result, torch.Tensor):
            result = (result,)
        result = list(result)
        grads_in: list[Any] = []
        for is_tensor in tensor_args:
            grads_in.append(result.pop(0) if is_tensor and result else None)
        return tuple(grads_in)

    if not aten:

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            _save_inputs(ctx, inputs)

        def custom_backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            return run_backward(_saved_inputs(ctx), grads)

        torch.library.register_autograd(op, custom_backward, setup_context=setup_context)
        return

    after_autograd = torch._C._after_autograd_keyset
    names = [a.name for a in schema.arguments]

    class _DeviceFormula(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, keyset: Any, *args: Any) -> Any:
            _save_inputs(ctx, args)
            return op.redispatch(keyset & after_autograd, *args)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return (None, *run_backward(_saved_inputs(ctx), grads))

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        # Function.apply takes positional arguments only.
        full = list(args) + [kwargs[n] for n in names[len(args) :] if n in kwargs]
        return _DeviceFormula.apply(keyset, *full)

    overload = schema.overload_name
    _library("aten", "IMPL").impl(
        schema.name.split("::")[1] + (f".{overload}" if overload else ""),
        autograd_kernel,
        "AutogradPrivateUse1",
        with_keyset=True,
    )


def _describe(func: Kernel) -> str:
    if isinstance(func, str):
        return func
    return f"Python function {getattr(func, '__qualname__', repr(func))}"


def register_operator(
    op_name: str,
    forward_func: Kernel,
    backward_func: Kernel | None = None,
    schema: str | None = None,
    *,
    fake_func: Callable[..., Any] | None = None,
) -> OperatorHandle:
    """Registers an operator served by a plugin kernel or a Python function, with its gradient.

    Args:
        op_name: ``"ns::name[.overload]"``. Outside ``aten`` it defines
            ``torch.ops.ns.name``; ``"aten::gelu"`` (or ``"gelu"``) targets
            PyTorch's operator on the device.
        forward_func: the kernel: an op-table entry of a registered plugin
            (``"sim::fused_bias_gelu"``), a symbol its library exports
            (``"torch_fl_op_sim__fused_bias_gelu"``), or a Python function
            (custom operators only; it then serves every device and is its
            own fake implementation, so it should use torch operators).
        backward_func: the gradient, by the convention in this module's
            docs: a plugin kernel (as above; a symbol outside the op table is
            defined as ``ns::name_backward``) or a Python function
            ``backward(*grads, *inputs) -> grads per Tensor input``. For an
            ATen operator it replaces PyTorch's formula on the device only.
        schema: the operator's schema, ``"fused_bias_gelu(Tensor x, Tensor
            bias) -> Tensor"``. Required for a custom operator unless
            ``forward_func`` is an op-table entry that has one; for ATen
            operators, PyTorch's.
        fake_func: output metadata for tracing (``torch.library.register_fake``),
            for a plugin kernel whose op table gives no ``infer_outputs``.

    Returns:
        An :class:`OperatorHandle`; call it, or ``handle.op``, like any operator.

    Raises:
        DuplicateOperatorError: the operator was registered before.
        OperatorSchemaError: no schema, one that does not parse, or one that
            names another operator.
        KernelSymbolError: no registered plugin has the kernel.
        OperatorArityError: a kernel's arguments or returns do not match the
            schema (or the backward convention).
        OperatorNotFoundError: an ATen operator this PyTorch lacks.

    Example::

        import torch, torch_fl
        torch_fl.register_device_plugin(name="sim")

        def scaled_tanh(x, scale):            # any torch code: runs on every device
            return torch.tanh(x) * scale

        def scaled_tanh_backward(grad, x, scale):
            return grad * scale * (1 - torch.tanh(x) ** 2)

        op = torch_fl.register_operator(
            "demo::scaled_tanh", scaled_tanh, scaled_tanh_backward,
            schema="scaled_tanh(Tensor x, float scale) -> Tensor")
        x = torch.randn(3, device="sim", requires_grad=True)
        torch.ops.demo.scaled_tanh(x, 2.0).sum().backward()
    """
    ns, name, overload = _split_name(op_name)
    qualname = f"{ns}::{name}"
    full_name = qualname + (f".{overload}" if overload else "")
    with _lock:
        if full_name in _registered:
            raise DuplicateOperatorError(
                f"{full_name} was already registered by torch_fl.register_operator "
                f"(forward: {_registered[full_name].forward}); an operator is registered once per process"
            )
        request = _Request(full_name, ns, name, overload, forward_func, backward_func, schema, fake_func)
        handle = _register_aten(request) if ns == "aten" else _register_custom(request)
        _registered[full_name] = handle
        return handle


def _register_custom(r: _Request) -> OperatorHandle:
    full_name, qualname, ns, name, overload = r.full_name, r.qualname, r.ns, r.name, r.overload
    forward_func, schema_text, fake_func = r.forward_func, r.schema_text, r.fake_func
    if _find_schema(ns, name, overload) is not None:
        raise DuplicateOperatorError(
            f"{full_name} already exists (defined by a plugin's op table, torch.library or an earlier "
            "registration); choose another name or namespace"
        )
    if schema_text is None and isinstance(forward_func, str):
        _, own = _table_schema(forward_func)
        if own is not None:
            schema_text = str(own).split("::", 1)[1].replace(own.name.split("::")[1], name, 1)
    if schema_text is None:
        raise OperatorSchemaError(
            f'custom operator {full_name} needs a schema, e.g. schema="{name}(Tensor x) -> Tensor"'
        )
    schema, body = _parse_schema(qualname, overload, schema_text)
    if isinstance(forward_func, str):
        _check_kernel_arity(full_name, schema, forward_func, "forward")
    else:
        _check_callable(forward_func, len(schema.arguments), "forward", full_name)

    backward = _resolve_backward(full_name, schema, r.backward_func)

    lib = _library(ns, "FRAGMENT")
    fake: str | None = None
    if fake_func is not None:
        # Defined here first so that the fake is in place before the plugin
        # kernel arrives: the shim then keeps it over infer_outputs.
        lib.define(body)
        torch.library.register_fake(_overload(ns, name, overload), fake_func, lib=lib)
        fake = _describe(fake_func)
    if isinstance(forward_func, str):
        forward = _register_plugin_kernel(qualname, overload, forward_func, body)
    else:
        if fake_func is None:
            lib.define(body)
        lib.impl(name + (f".{overload}" if overload else ""), forward_func, "CompositeExplicitAutograd")
        forward = _describe(forward_func)
    op = _overload(ns, name, overload)

    if fake is None and not isinstance(forward_func, str):
        fake = "the Python forward, on meta tensors"
    elif fake is None and torch._C._dispatch_has_kernel_for_dispatch_key(full_name, "Meta"):
        fake = "the plugin's infer_outputs"

    bwd_description: str | None = None
    if backward is not None:
        bwd_fn, bwd_description = backward
        wire_autograd(op, bwd_fn)
    return OperatorHandle(name=full_name, op=op, forward=forward, backward=bwd_description, fake=fake)


def _resolve_backward(
    full_name: str, schema: torch._C.FunctionSchema, backward_func: Kernel | None
) -> tuple[Callable[..., Any], str] | None:
    """The backward as a callable; registers a plugin backward kernel as an operator first."""
    if backward_func is None:
        return None
    n_args = len(schema.returns) + len(schema.arguments)
    if not isinstance(backward_func, str):
        _check_callable(backward_func, n_args, "backward", full_name)
        return backward_func, _describe(backward_func)
    table_op, own = _table_schema(backward_func)
    if table_op is not None and "::" in table_op and own is not None:
        _check_backward_schema(full_name, schema, own)
        b_ns, b_name, b_overload = _split_name(table_op)
        return _overload(b_ns, b_name, b_overload), f"plugin kernel {table_op!r}"
    # Any other kernel serves a new operator with the derived schema:
    # ns::name_backward, or torch_fl::aten_name_backward for ATen operators.
    ns, name, overload = _split_name(full_name)
    b_name = "_".join(p for p in (name, overload, "backward") if p)
    if ns == "aten":
        ns, b_name = "torch_fl", f"aten_{b_name}"
    if _find_schema(ns, b_name, "") is not None:
        raise DuplicateOperatorError(f"{ns}::{b_name}, the backward operator of {full_name}, already exists")
    body = _backward_schema(schema, b_name)
    _check_kernel_arity(f"{ns}::{b_name}", torch._C.parse_schema(f"{ns}::{body}"), backward_func, "backward")
    description = _register_plugin_kernel(f"{ns}::{b_name}", "", backward_func, body)
    return _overload(ns, b_name, ""), description


def _register_aten(r: _Request) -> OperatorHandle:
    full_name, name, overload, forward_func = r.full_name, r.name, r.overload, r.forward_func
    schema = _find_schema("aten", name, overload)
    if schema is None:
        raise OperatorNotFoundError(
            f"PyTorch {torch.__version__} has no operator {full_name}; custom operators need a namespace "
            'of their own, e.g. "myplugin::' + name + '"'
        )
    if r.schema_text is not None:
        given, _ = _parse_schema(f"aten::{name}", overload, r.schema_text)
        if _arity(given) != _arity(schema):
            raise OperatorArityError(f"the schema given for {full_name}, {given}, does not match PyTorch's: {schema}")
    if r.fake_func is not None:
        raise OperatorSchemaError(f"{full_name} is an ATen operator: PyTorch already has its fake implementation")
    if not isinstance(forward_func, str):
        raise OperatorSchemaError(
            f"{full_name}: an ATen operator's forward must be a plugin kernel (its op-table name or symbol); "
            "a Python function can define a custom operator instead"
        )
    _check_kernel_arity(full_name, schema, forward_func, "forward")
    backward = _resolve_backward(full_name, schema, r.backward_func)
    forward = _register_plugin_kernel("aten::" + name, overload, forward_func, None)
    op = _overload("aten", name, overload)
    bwd_description: str | None = None
    if backward is not None:
        bwd_fn, bwd_description = backward
        wire_autograd(op, bwd_fn, aten=True)
    return OperatorHandle(name=full_name, op=op, forward=forward, backward=bwd_description, fake=None)


def wire_plugin_autograd(plugin: _native.Plugin) -> list[str]:
    """Wires ``ns::op`` to ``ns::op_backward`` for the custom operators of ``plugin``'s table.

    Called when a plugin is registered; returns the operators made differentiable.
    """
    wired = []
    ops = set(plugin.ops)
    with _lock:
        for op_name in sorted(ops):
            # aten operators have PyTorch's autograd: skip them before
            # parsing (a plugin table holds hundreds).
            if "::" not in op_name or op_name.startswith("aten::"):
                continue
            ns, name, overload = _split_name(op_name)
            backward_name = f"{ns}::{name}_backward" + (f".{overload}" if overload else "")
            if ns == "aten" or backward_name not in ops or op_name in _registered:
                continue
            forward = _find_schema(ns, name, overload)
            backward = _find_schema(ns, f"{name}_backward", overload)
            if forward is None or backward is None:
                continue  # not registered with PyTorch (reported by register_device_plugin)
            _check_backward_schema(op_name, forward, backward)
            op = _overload(ns, name, overload)
            wire_autograd(op, _overload(ns, f"{name}_backward", overload))
            _registered[op_name] = OperatorHandle(
                name=op_name,
                op=op,
                forward=f"plugin kernel {op_name!r} of {plugin.label}",
                backward=f"plugin kernel {backward_name!r}",
                fake="the plugin's infer_outputs"
                if torch._C._dispatch_has_kernel_for_dispatch_key(op_name, "Meta")
                else None,
            )
            wired.append(op_name)
    return wired

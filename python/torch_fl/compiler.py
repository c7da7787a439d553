"""``torch.compile`` on a plugin device.

Both backends users reach for work:

- ``backend="aot_eager"`` (and ``"eager"``) trace the model and run the
  captured graph through the dispatcher, so every operator reaches the
  plugin exactly as in eager mode. Nothing device-specific is needed.
- The default backend, Inductor, generates code. For a plugin whose device
  memory the host can address (``host_addressable_memory``), torch-fl
  gives Inductor its CPU C++ code generator: fused kernels run on the host
  directly over device memory, in the order of the current stream as a CUDA
  kernel would run on it: before one, the host waits for the current stream
  of the device, and only when work was queued on that stream since the
  last wait (consecutive fused kernels wait once; other streams are ordered
  by the user's events and ``wait_stream``, as on CUDA), and everything Inductor
  does not fuse (matrix products, convolutions) stays an ATen call that runs
  on the plugin. For a plugin whose memory the host cannot address, the
  first compiled call fails, before any step runs, with a message naming
  the backends that work.

PyTorch finds a custom device's code generators on its device module
(``torch.<name>.Scheduling`` and friends) when Inductor first starts, so
nothing here is imported before a model is compiled: Dynamo and Inductor
take seconds to import, registration a few milliseconds. Dynamo's device
interface (``torch._dynamo.device_interface.get_interface_for_device``) is
registered the moment Dynamo's module is imported, by whoever imports it,
so it is there whenever anyone can ask for it.
"""

from __future__ import annotations

import types
from typing import Any

from . import _C, _import_hooks

SUPPORTED_WITHOUT_HOST_ACCESS = ("aot_eager", "eager")


def _not_host_addressable(name: str, plugin: str) -> str:
    return (
        f"torch.compile's default backend (Inductor) generates host code, and the memory of device "
        f"'{name}' (plugin {plugin}) is not addressable by the host. Compile with "
        f"backend={SUPPORTED_WITHOUT_HOST_ACCESS[0]!r} (or 'eager') instead: it runs the captured graph "
        f"through the plugin's kernels."
    )


def _device_interface(module: types.ModuleType) -> type:
    import torch
    from torch._dynamo.device_interface import CpuInterface

    class PluginDeviceInterface(CpuInterface):
        """Dynamo's and Inductor's view of the plugin device: the device module's runtime calls.

        Based on the CPU's interface because Inductor generates CPU code for
        the device (see the module docstring); for the same reason
        ``get_compute_capability`` stays the CPU's: it keys Inductor's
        caches by the code generator's target, which is the host.
        """

        device = module.device
        # The device-generic classes, as CUDA's interface names its own.
        Event = torch.Event  # type: ignore[assignment] # CpuInterface's is a host-timer stand-in
        Stream = torch.Stream

        class Worker:
            set_device = staticmethod(module.set_device)
            current_device = staticmethod(module.current_device)
            get_device_properties = staticmethod(module.get_device_properties)

        @staticmethod
        def is_available() -> bool:
            return bool(module.is_available())

        @staticmethod
        def device_count() -> int:
            return int(module.device_count())

        @staticmethod
        def current_device() -> int:
            return int(module.current_device())

        @staticmethod
        def set_device(device: Any) -> None:
            module.set_device(device)

        @staticmethod
        def exchange_device(device: int) -> int:
            return int(torch._C._accelerator_hooks_exchange_device(device))

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return int(torch._C._accelerator_hooks_maybe_exchange_device(device))

        @staticmethod
        def synchronize(device: Any = None) -> None:
            module.synchronize(device)

        @staticmethod
        def stream(stream: torch.Stream) -> Any:
            return module.stream(stream)

        @staticmethod
        def current_stream() -> torch.Stream:
            return module.current_stream()  # type: ignore[no-any-return] # the module is typed as ModuleType

        @staticmethod
        def set_stream(stream: torch.Stream) -> None:
            module.set_stream(stream)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            module.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return bool(module.is_bf16_supported(including_emulation))

        @staticmethod
        def memory_allocated(device: Any = None) -> int:
            return int(module.memory_allocated(device))

    return PluginDeviceInterface


def _register_device_interface(device_interface: types.ModuleType, module: types.ModuleType, name: str) -> None:
    """Registers the plugin's interface with Dynamo, under ``name`` and each ``name:i`` as CUDA's is."""
    interface = _device_interface(module)
    device_interface.register_interface_for_device(name, interface)
    for index in range(int(module.device_count())):
        device_interface.register_interface_for_device(f"{name}:{index}", interface)


def _host_codegen(name: str) -> dict[str, Any]:
    """Inductor's CPU code generators, adapted to run on device memory."""
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
    from torch._inductor.virtualized import V

    class PluginWrapperCodegen(PythonWrapperCodegen):
        """Calls generated C++ kernels like the CPU does, once their stream has run the work they read."""

        @staticmethod
        def create(
            is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any, partition_signatures: Any = None
        ) -> PythonWrapperCodegen:
            if is_subgraph:
                wrapper: PythonWrapperCodegen = PythonWrapperCodegen.create(
                    is_subgraph, subgraph_name, parent_wrapper, partition_signatures
                )
                return wrapper
            return PluginWrapperCodegen()  # type: ignore[no-untyped-call] # Inductor's __init__ is unannotated

        def _generate_kernel_call_helper(
            self, kernel_name: str, call_args: Any, *, device: Any = None, triton: bool = True, **kwargs: Any
        ) -> None:
            device = device or V.graph.get_current_device_or_throw()
            if triton or device.type != name:
                super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
                return
            index = "None" if device.index is None else str(device.index)
            # Inductor's wrapper methods are unannotated.
            self.writeline(f"__import__('torch_fl.compiler').compiler.before_host_kernel({name!r}, {index})")  # type: ignore[no-untyped-call]
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))  # type: ignore[no-untyped-call]

    return {
        "Scheduling": CppScheduling,
        "PythonWrapperCodegen": PluginWrapperCodegen,
        "CppWrapperCodegen": CppWrapperCpu,
        "WrapperFxCodegen": WrapperFxCodegen,
    }


def _refusing_codegen(message: str) -> dict[str, Any]:
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

    class RefusingScheduling:
        """Stands in for a code generator: compiling for this device is refused."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(message)

    return {
        "Scheduling": RefusingScheduling,
        "PythonWrapperCodegen": PythonWrapperCodegen,
        "CppWrapperCodegen": CppWrapperCpu,
        "WrapperFxCodegen": WrapperFxCodegen,
    }


# Per device name: the message to raise when its memory is not host-addressable.
_REFUSALS: dict[str, str | None] = {}


def before_host_kernel(name: str, index: int | None) -> None:
    """Called by generated code before a host kernel runs over device memory.

    Inductor caches compiled code across processes, so code generated for a
    host-addressable plugin may be loaded for one that is not (same device
    name): refuse it here, before the kernel touches memory.
    """
    refusal = _REFUSALS.get(name)
    if refusal is not None:
        raise RuntimeError(refusal)
    # The current stream only, and only if work was queued on it since the
    # last wait: the kernel runs in that stream's order, as on CUDA.
    _C.wait_current_stream_if_pending(-1 if index is None else index)


def install(module: types.ModuleType, name: str, plugin: str, host_addressable: bool) -> None:
    """Expose Inductor's hooks on the device module ``torch.<name>``, resolved on first use.

    Args:
        module: the device module.
        name: the device name.
        plugin: the plugin's label, for messages.
        host_addressable: whether the host may read and write device memory.
    """
    hooks: dict[str, Any] = {}
    _REFUSALS[name] = None if host_addressable else _not_host_addressable(name, plugin)

    def resolve(attr: str) -> Any:
        if attr not in {"Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"}:
            raise AttributeError(f"module 'torch.{name}' has no attribute {attr!r}")
        if not hooks:
            from torch._inductor.codegen.common import register_device_op_overrides
            from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides

            register_device_op_overrides(name, CpuDeviceOpOverrides())
            hooks.update(
                _host_codegen(name) if host_addressable else _refusing_codegen(_not_host_addressable(name, plugin))
            )
        return hooks[attr]

    # PEP 562: a module's __getattr__ is consulted for attributes it lacks.
    setattr(module, "__getattr__", resolve)  # noqa: B010 - assigning the attribute directly is refused by mypy
    _import_hooks.when_imported(
        "torch._dynamo.device_interface",
        lambda device_interface: _register_device_interface(device_interface, module, name),
    )

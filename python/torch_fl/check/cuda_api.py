"""Where each ``torch.cuda`` name goes: its rule and its device-agnostic replacement.

A replacement is a dotted path under the module's ``torch`` binding (written
``{T}``), substituted for the reference with the call's arguments kept; None
means there is no mechanical rewrite and the advice says what to do instead.
"""

from __future__ import annotations

from typing import NamedTuple


class CudaName(NamedTuple):
    rule: str
    replacement: str | None
    advice: str


def _same(rule: str, target: str, names: str) -> dict[str, CudaName]:
    return {name: CudaName(rule, f"{{T}}.{target}.{name}", f"torch.{target}.{name}") for name in names.split()}


CUDA_NAMES: dict[str, CudaName] = {
    "is_available": CudaName("FL020", "{T}.accelerator.is_available", "torch.accelerator.is_available()"),
    # Device management
    "device_count": CudaName("FL021", "{T}.accelerator.device_count", "torch.accelerator.device_count()"),
    "current_device": CudaName(
        "FL021", "{T}.accelerator.current_device_index", "torch.accelerator.current_device_index()"
    ),
    "set_device": CudaName("FL021", "{T}.accelerator.set_device_index", "torch.accelerator.set_device_index(i)"),
    "device": CudaName("FL021", "{T}.accelerator.device_index", "with torch.accelerator.device_index(i):"),
    "get_device_name": CudaName(
        "FL021", None, "torch.get_device_module(device).get_device_name() where the device module has it"
    ),
    "get_device_properties": CudaName(
        "FL021", None, "torch.get_device_module(device).get_device_properties() where the device module has it"
    ),
    "init": CudaName("FL021", None, "nothing: devices initialize lazily"),
    "is_initialized": CudaName("FL021", None, "torch.get_device_module(device).is_initialized()"),
    # Synchronization
    "synchronize": CudaName("FL022", "{T}.accelerator.synchronize", "torch.accelerator.synchronize()"),
    # Memory
    **_same(
        "FL023",
        "accelerator",
        "memory_allocated max_memory_allocated memory_reserved max_memory_reserved memory_stats "
        "reset_peak_memory_stats reset_accumulated_memory_stats empty_cache",
    ),
    "mem_get_info": CudaName("FL023", "{T}.accelerator.get_memory_info", "torch.accelerator.get_memory_info()"),
    "reset_max_memory_allocated": CudaName(
        "FL023", "{T}.accelerator.reset_peak_memory_stats", "torch.accelerator.reset_peak_memory_stats()"
    ),
    "memory_summary": CudaName("FL023", None, "torch.accelerator.memory_stats()"),
    "set_per_process_memory_fraction": CudaName(
        "FL023", None, "torch.get_device_module(device).set_per_process_memory_fraction where the module has it"
    ),
    "memory": CudaName("FL023", None, "torch.accelerator memory functions"),
    # Streams and events
    "Stream": CudaName("FL024", "{T}.Stream", "torch.Stream(device)"),
    "current_stream": CudaName("FL024", "{T}.accelerator.current_stream", "torch.accelerator.current_stream()"),
    "set_stream": CudaName("FL024", "{T}.accelerator.set_stream", "torch.accelerator.set_stream(s)"),
    "stream": CudaName("FL024", None, "`with s:` (a torch.Stream is a context manager)"),
    "default_stream": CudaName("FL024", None, "torch.get_device_module(device).default_stream()"),
    "ExternalStream": CudaName("FL024", None, "a torch.Stream of the device"),
    "Event": CudaName("FL025", "{T}.Event", "torch.Event(enable_timing=True)"),
    # Random numbers
    "manual_seed": CudaName("FL026", "{T}.manual_seed", "torch.manual_seed(seed) (seeds every device)"),
    "manual_seed_all": CudaName("FL026", "{T}.manual_seed", "torch.manual_seed(seed) (seeds every device)"),
    "seed": CudaName("FL026", "{T}.seed", "torch.seed()"),
    "seed_all": CudaName("FL026", "{T}.seed", "torch.seed()"),
    **_same("FL026", "accelerator.random", "initial_seed get_rng_state get_rng_state_all"),
    "set_rng_state": CudaName("FL026", None, "torch.get_device_module(device).set_rng_state(state)"),
    "set_rng_state_all": CudaName("FL026", None, "torch.get_device_module(device).set_rng_state_all(states)"),
    # Capability and dtype support
    "get_device_capability": CudaName(
        "FL027", None, "torch.accelerator.get_device_capability() (a dict of features, not a version)"
    ),
    "is_bf16_supported": CudaName(
        "FL027", None, "torch.get_device_module(device).is_bf16_supported() where the device module has it"
    ),
    "is_tf32_supported": CudaName("FL027", None, "torch.accelerator.get_device_capability()"),
    "get_arch_list": CudaName("FL027", None, "torch.accelerator.get_device_capability()"),
    # AMP: the call sites are rewritten, see engine.py
    "amp": CudaName("FL028", None, "torch.amp"),
    # Graphs
    "CUDAGraph": CudaName("FL029", None, "torch.accelerator.Graph where the device supports graphs"),
    "graph": CudaName("FL029", None, "torch.accelerator.Graph where the device supports graphs"),
    "graphs": CudaName("FL029", None, "torch.accelerator.Graph where the device supports graphs"),
    "make_graphed_callables": CudaName("FL029", None, "run eagerly, or torch.compile"),
    # Other
    "OutOfMemoryError": CudaName("FL031", "{T}.OutOfMemoryError", "torch.OutOfMemoryError"),
    "nvtx": CudaName("FL031", None, "torch.profiler.record_function(name)"),
}

#: torch.cuda.amp names rewritten at their call: the callee and where the device type goes.
AMP_CALLS: dict[str, tuple[str, str]] = {
    "autocast": ("{T}.amp.autocast", "positional"),
    "GradScaler": ("{T}.amp.GradScaler", "positional"),
    "custom_fwd": ("{T}.amp.custom_fwd", "device_type"),
    "custom_bwd": ("{T}.amp.custom_bwd", "device_type"),
}


def lookup(qualified: str) -> CudaName:
    """Rule and replacement of a ``torch.cuda.<...>`` qualified name."""
    rest = qualified[len("torch.cuda.") :] if qualified.startswith("torch.cuda.") else ""
    first = rest.split(".", 1)[0]
    if first in CUDA_NAMES and (first in ("amp", "nvtx", "memory", "graphs") or first == rest):
        return CUDA_NAMES[first]
    if first.endswith("Tensor") or first.endswith("Storage"):
        return CudaName("FL030", None, "torch.tensor(..., dtype=..., device=device)")
    if not rest:
        return CudaName("FL031", "{T}.get_device_module()", "torch.get_device_module(device)")
    return CudaName("FL031", None, f"torch.get_device_module(device).{rest}")

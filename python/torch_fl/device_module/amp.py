"""What ``torch.autocast(device_type=<name>)`` may use: the runtime plugin's declared dtypes."""

from __future__ import annotations

import torch

from .. import _native

_CAPABILITY_DTYPES = ((torch.float16, "float16"), (torch.bfloat16, "bfloat16"))


def amp_dtypes(plugin: _native.Plugin) -> list[torch.dtype]:
    """The lower-precision dtypes ``plugin`` declares (ABI 1.1 capability bits).

    A 1.0 plugin could not declare them; it gets what CUDA's autocast
    offers, and ops whose kernel lacks a dtype fall back as usual.
    """
    major, minor = (int(p) for p in plugin.abi_effective_version.split(".")[:2])
    if (major, minor) < (1, 1):
        return [dtype for dtype, _ in _CAPABILITY_DTYPES]
    caps = set(plugin.capabilities)
    return [dtype for dtype, cap in _CAPABILITY_DTYPES if cap in caps]


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The lower-precision dtypes ``torch.autocast(device_type=<name>)`` may use."""
    runtime = _native.bound_runtime()
    return [] if runtime is None else amp_dtypes(runtime)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the device runs bfloat16, as ``torch.cuda.is_bf16_supported`` answers.

    Natively when the plugin declares bfloat16 kernels (``TFL_CAP_BFLOAT16``).
    ``including_emulation`` (the default, as on CUDA) also counts the CPU
    fallback, which runs any bfloat16 operator the plugin lacks: then the
    answer is true whenever a device is registered.
    """
    if _native.bound_runtime() is None:
        return False
    return including_emulation or torch.bfloat16 in get_amp_supported_dtype()

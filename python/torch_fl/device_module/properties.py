"""What a device is: ``get_device_properties`` and ``get_device_capability``, as ``torch.cuda`` has them.

The figures are the runtime plugin's ``TFL_DeviceProperties``. Two of
CUDA's names differ from the ABI's: ``multi_processor_count`` is the
plugin's ``compute_units`` (what Inductor sizes its work by), and
``major``/``minor`` are its ``capability_major``/``capability_minor``
(ABI 1.2), the vendor's architecture revision, which only the vendor's own
code can interpret. A plugin older than ABI 1.2 could not declare a
revision: it reports ``(0, 0)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _native
from ._index import DeviceLike, device_index, device_name


@dataclass(frozen=True)
class DeviceProperties:
    """The properties of one device, with the attribute names of ``torch.cuda``'s.

    Attributes:
        name: the device's name, as the plugin reports it.
        major: the architecture revision's major number (0: not declared).
        minor: its minor number.
        total_memory: bytes the device can allocate in all.
        multi_processor_count: the plugin's compute units (0 when unknown).
        memory_alignment: the alignment of device allocations, in bytes.
        index: the device index.
        type: the torch-fl device name (``"sim"``).
    """

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    memory_alignment: int
    index: int
    type: str

    @property
    def compute_units(self) -> int:
        """The ABI's name for :attr:`multi_processor_count`."""
        return self.multi_processor_count

    def __repr__(self) -> str:
        # The shape of CUDA's repr: name, capability, memory in MB, units.
        return (
            f"_{self.type.capitalize()}DeviceProperties(name={self.name!r}, major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count}, memory_alignment={self.memory_alignment})"
        )


# Properties never change while the process runs (one runtime plugin, fixed
# devices); Inductor asks for them at every compilation.
_CACHE: dict[int, DeviceProperties] = {}


def _runtime() -> _native.Plugin:
    runtime = _native.bound_runtime()
    if runtime is None:
        device_name()  # raises the "no device registered" error
        raise AssertionError("a bound device name without a runtime plugin")
    return runtime


def get_device_properties(device: DeviceLike = None) -> DeviceProperties:
    """The properties of ``device`` (default: the current device).

    Raises:
        torch_fl.InvalidDeviceError: the index is not a device of the plugin.
    """
    idx = device_index(device)
    cached = _CACHE.get(idx)
    if cached is not None:
        return cached
    raw = _runtime().device_properties(idx)

    def number(key: str) -> int:
        value = raw[key]
        assert isinstance(value, int), f"device_properties()[{key!r}] is {value!r}"
        return value

    props = DeviceProperties(
        name=str(raw["name"]),
        major=number("capability_major"),
        minor=number("capability_minor"),
        total_memory=number("total_memory"),
        multi_processor_count=number("compute_units"),
        memory_alignment=number("memory_alignment"),
        index=idx,
        type=device_name(),
    )
    _CACHE[idx] = props
    return props


def get_device_capability(device: DeviceLike = None) -> tuple[int, int]:
    """The architecture revision ``(major, minor)`` of ``device``; ``(0, 0)`` when the plugin did not declare one."""
    props = get_device_properties(device)
    return props.major, props.minor


def get_device_name(device: DeviceLike = None) -> str:
    """The name of ``device``, as the plugin reports it."""
    return get_device_properties(device).name

"""torch.<name>'s device queries (properties, capability, dtypes) and Dynamo's device interface."""

from __future__ import annotations

import pytest
import torch

import torch_fl
from torch_fl import _native

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_device_properties_come_from_the_plugin(sim: torch_fl.PluginHandle) -> None:
    for index, expected in enumerate(sim.devices):
        props = torch.sim.get_device_properties(index)
        assert props.name == expected["name"] == "torch-fl simulated accelerator"
        assert props.total_memory == expected["total_memory"] > 0
        assert props.multi_processor_count == props.compute_units == expected["compute_units"] > 0
        assert props.memory_alignment == expected["memory_alignment"] >= 64
        assert (props.major, props.minor) == (expected["capability_major"], expected["capability_minor"]) == (1, 0)
        assert (props.type, props.index) == (DEVICE, index)


@pytest.mark.parametrize("where", [1, "sim:1", torch.device("sim:1")])
def test_every_way_of_naming_a_device(where: int | str | torch.device) -> None:
    assert torch.sim.get_device_properties(where).index == 1


def test_the_default_is_the_current_device() -> None:
    with torch.sim.device(1):
        assert torch.sim.get_device_properties().index == 1
        assert torch.sim.get_device_properties("sim").index == 1
    assert torch.sim.get_device_properties().index == torch.sim.current_device() == 0


def test_the_repr_reads_like_cudas() -> None:
    props = torch.sim.get_device_properties(0)
    text = repr(props)
    assert text.startswith("_SimDeviceProperties(name='torch-fl simulated accelerator', major=1, minor=0, ")
    assert f"total_memory={props.total_memory // 2**20}MB" in text
    assert f"multi_processor_count={props.multi_processor_count}" in text


def test_capability_and_name() -> None:
    assert torch.sim.get_device_capability() == (1, 0)
    assert torch.sim.get_device_capability("sim:1") == (1, 0)
    assert torch.sim.get_device_name(1) == "torch-fl simulated accelerator"


def test_a_device_the_plugin_lacks_is_an_error() -> None:
    with pytest.raises(torch_fl.InvalidDeviceError, match="device index 5 is out of range"):
        torch.sim.get_device_properties(5)
    with pytest.raises(ValueError, match="expected a sim device, got cpu"):
        torch.sim.get_device_properties("cpu")


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
def test_capability_needs_abi_1_2(fixture_plugin) -> None:
    # The fixture announces ABI 1.0 unless told otherwise; its code would
    # write the 1.2 fields if the host offered them.
    older = _native.load_plugin(str(fixture_plugin("caps_1_0")))
    assert older.abi_effective_version == "1.0"
    props = older.device_properties(0)
    assert (props["capability_major"], props["capability_minor"]) == (0, 0)
    assert props["name"] == "minimal-c host device"
    current = _native.load_plugin(str(fixture_plugin("caps_1_2", "FIXTURE_ABI_MINOR=2")))
    props = current.device_properties(0)
    assert (props["capability_major"], props["capability_minor"]) == (1, 0)


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
def test_an_older_plugin_reports_capability_0_0(fixture_plugin) -> None:
    plugin = fixture_plugin("caps_device", 'FIXTURE_NAME="older"')
    out = assert_ok(
        run_python(
            f"""
            import torch, torch_fl
            torch_fl.register_device_plugin(name="older", plugin_path={str(plugin)!r})
            print(torch.older.get_device_capability(), torch.older.get_device_properties().name)
            """
        )
    )
    assert out.strip() == "(0, 0) minimal-c host device"


def test_bfloat16_support_follows_the_plugins_declaration(sim: torch_fl.PluginHandle) -> None:
    assert torch.sim.is_bf16_supported()
    assert torch.sim.is_bf16_supported(including_emulation=False) == ("bfloat16" in sim.capabilities)
    assert torch.sim.is_bf16_supported(including_emulation=False)


def test_accelerator_capability_lists_the_dtypes_tensors_can_have() -> None:
    dtypes = torch.accelerator.get_device_capability("sim:0")["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8} <= dtypes
    for dtype in dtypes:
        x = torch.ones(3, dtype=dtype).to(DEVICE)
        assert x.dtype == dtype and x.device.type == DEVICE
        # Conversions between supported dtypes stay on the device.
        wide = torch.complex128 if dtype.is_complex else torch.float64
        y = x.to(wide)
        assert y.device.type == DEVICE and y.cpu().tolist() == [1.0, 1.0, 1.0]
        assert torch.equal(y.to(dtype).cpu(), torch.ones(3, dtype=dtype))
    assert torch.accelerator.get_device_capability("sim:1")["supported_dtypes"] == dtypes


def test_device_of_selects_a_tensors_device() -> None:
    x = torch.ones(1, device="sim:1")
    with torch.sim.device_of(x):
        assert torch.sim.current_device() == 1
    assert torch.sim.current_device() == 0
    with torch.sim.device_of(torch.ones(1)):  # a CPU tensor changes nothing
        assert torch.sim.current_device() == 0


def test_dynamo_finds_the_device_interface_without_registration_importing_it() -> None:
    out = assert_ok(
        run_python(
            """
            import sys, torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            print("dynamo imported by registration:", "torch._dynamo" in sys.modules)
            from torch._dynamo.device_interface import get_interface_for_device
            iface = get_interface_for_device("sim")
            assert get_interface_for_device("sim:1") is iface
            assert get_interface_for_device(torch.device("sim:0")) is iface
            assert iface.is_available() and iface.device_count() == 2
            prev = iface.exchange_device(1)
            assert (prev, iface.current_device()) == (0, 1)
            iface.maybe_exchange_device(prev)
            assert iface.current_device() == 0
            props = iface.get_device_properties("sim:0")
            print(props.multi_processor_count == torch.sim.get_device_properties(0).multi_processor_count)
            s = iface.Stream(device="sim:1")
            with iface.stream(s):
                assert iface.current_stream() == s
            iface.synchronize()
            x = torch.ones(256, device="sim")
            print(iface.memory_allocated() == torch.sim.memory_allocated() > 0, iface.is_bf16_supported())
            """
        )
    )
    assert out.splitlines() == ["dynamo imported by registration: False", "True", "True True"]


def test_dynamo_imported_before_registration_gets_the_interface_at_once() -> None:
    out = assert_ok(
        run_python(
            """
            import torch
            import torch._dynamo.device_interface as di
            import torch_fl
            torch_fl.register_device_plugin(name="sim")
            print(di.get_interface_for_device("sim").device_count())
            """
        )
    )
    assert out.strip() == "2"

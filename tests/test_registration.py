"""register_device_plugin: discovery, the handle, composition and every refusal."""

from __future__ import annotations

import pytest
import torch

import torch_fl
from torch_fl import _native

from .conftest import DEVICE, assert_ok, run_python


def test_the_bundled_simulated_accelerator_is_registered(sim: torch_fl.PluginHandle) -> None:
    assert sim.device == DEVICE
    assert sim.name == "sim"
    assert sim.vendor == "torch-fl project"
    assert sim.abi_version == torch_fl.ABI_VERSION == "1.8"
    assert sim.origin == "the bundled simulated accelerator"
    assert sim.device_count == 2
    assert [d["name"] for d in sim.devices] == ["torch-fl simulated accelerator"] * 2
    assert "add.Tensor" in sim.ops and "mm" in sim.ops
    assert "event_timing" in sim.capabilities
    # Structured ops go through PyTorch's meta functions to their out= form.
    assert sim.registrations["add.Tensor"] == "registered_as_out"
    assert sim.registrations["add_.Tensor"] == "registered"
    assert "PluginHandle(device='sim'" in repr(sim)


def test_torch_sees_the_device(sim: torch_fl.PluginHandle) -> None:
    assert torch.device("sim:1").type == "sim"
    assert torch._C._get_privateuse1_backend_name() == "sim"
    assert torch.sim.is_available() and torch.sim.device_count() == 2
    assert torch.accelerator.current_accelerator() == torch.device("sim")
    assert torch.accelerator.device_count() == 2
    x = torch.ones(2)
    assert x.sim().is_sim and not x.is_sim
    assert torch.nn.Linear(2, 2).sim().weight.device.type == "sim"


def test_the_readme_example_runs_verbatim() -> None:
    # The seed's first example, as in the README (in a fresh process).
    out = assert_ok(
        run_python(
            """
            import torch
            import torch_fl

            torch_fl.register_device_plugin(name="sim")
            x = torch.randn(2, 3)
            y = x.to("sim")
            print(y.device)
            """
        )
    )
    assert out.strip() == "sim:0"


def test_registering_again_is_idempotent(sim: torch_fl.PluginHandle) -> None:
    again = torch_fl.register_device_plugin(name=DEVICE)
    assert again.plugin.label == sim.plugin.label
    assert again.registrations == {}, "nothing changed, so nothing was re-registered"


def test_a_second_device_name_is_refused() -> None:
    with pytest.raises(torch_fl.DeviceNameConflictError, match="already registered the torch-fl device 'sim'"):
        torch_fl.register_device_plugin(name="npu")


@pytest.mark.parametrize("name", ["cuda", "cpu", "meta", "xpu"])
def test_builtin_device_names_are_refused(name: str) -> None:
    with pytest.raises(torch_fl.InvalidDeviceNameError, match="built-in device types"):
        torch_fl.register_device_plugin(name=name)


def test_malformed_device_names_are_refused() -> None:
    with pytest.raises(torch_fl.InvalidDeviceNameError, match="lowercase letter"):
        torch_fl.register_device_plugin(name="My-Device")


def test_metadata_is_checked_against_the_plugin(sim: torch_fl.PluginHandle) -> None:
    torch_fl.register_device_plugin(name=DEVICE, metadata={"min_torch_version": "2.4", "vendor": "torch-fl project"})
    with pytest.raises(torch_fl.MetadataMismatchError, match='reports vendor = "torch-fl project"'):
        torch_fl.register_device_plugin(name=DEVICE, metadata={"vendor": "Acme"})
    with pytest.raises(torch_fl.MetadataMismatchError, match="known keys are"):
        torch_fl.register_device_plugin(name=DEVICE, metadata={"colour": "blue"})


def test_a_plugin_needing_a_newer_torch_is_refused(sim: torch_fl.PluginHandle) -> None:
    with pytest.raises(torch_fl.TorchVersionError, match=r"requires PyTorch >= 2.4, but 2.3.1 is installed"):
        _native.bind_device(DEVICE, sim.plugin, 0, "2.3.1")


def test_discovery_through_torch_fl_plugin_path(fixture_plugin, tmp_path) -> None:
    plugin = fixture_plugin("acme", 'FIXTURE_NAME="acme"')
    (tmp_path / "libtorchfl_acme.so").write_bytes(plugin.read_bytes())
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            h = torch_fl.register_device_plugin(name="acme")
            print(h.origin)
            x = torch.ones(3).to("acme")
            print(x.device, (x + x).cpu().tolist())
            """,
            env={"TORCH_FL_PLUGIN_PATH": str(tmp_path)},
        )
    )
    assert "TORCH_FL_PLUGIN_PATH" in out
    assert "acme:0 [2.0, 2.0, 2.0]" in out


def test_discovery_of_a_preloaded_library(fixture_plugin) -> None:
    plugin = fixture_plugin("preloaded", 'FIXTURE_NAME="preloaded"')
    out = assert_ok(
        run_python(
            f"""
            import ctypes, torch, torch_fl
            ctypes.CDLL({str(plugin)!r}, mode=ctypes.RTLD_GLOBAL)
            h = torch_fl.register_device_plugin(name="preloaded")
            print(h.origin, h.plugin.path)
            """
        )
    )
    assert out.split() == ["a", "library", "already", "loaded", "in", "the", "process", str(plugin)]


def test_an_unknown_name_lists_what_was_searched() -> None:
    result = run_python(
        """
        import torch_fl
        try:
            torch_fl.register_device_plugin(name="nowhere")
        except torch_fl.PluginNotFoundError as e:
            assert isinstance(e, LookupError)
            print(e)
        """,
        env={"TORCH_FL_PLUGIN_PATH": ""},
    )
    out = assert_ok(result)
    assert "no torch-fl plugin named 'nowhere'" in out and "TORCH_FL_PLUGIN_PATH" in out


def test_plugins_compose_by_priority(fixture_plugin) -> None:
    # The C example (host memory) overrides relu and neg on the simulated
    # device, whose memory is host-addressable in the default mode.
    plugin = fixture_plugin("compose", 'FIXTURE_NAME="compose"')
    out = assert_ok(
        run_python(
            f"""
            import torch, torch_fl
            from torch_fl import _native
            torch_fl.register_device_plugin(name="sim")
            h = torch_fl.register_device_plugin(name="sim", plugin_path={str(plugin)!r}, priority=10)
            served = _native.served_ops()
            print(served["relu"], served["neg"], served["mm"])
            x = torch.tensor([-1.0, 2.0]).to("sim")
            print(torch.relu(x).cpu().tolist(), torch.neg(x).cpu().tolist())
            """,
            env={"TORCH_FL_SIM_STRICT": "0"},
        )
    )
    assert out.splitlines() == ["compose compose sim", "[0.0, 2.0] [1.0, -2.0]"]


def test_an_incompatible_plugin_is_refused(fixture_plugin) -> None:
    # In strict mode the simulated device's memory is not host-addressable,
    # so a host-memory plugin's kernels could not read it.
    plugin = fixture_plugin("incompatible", 'FIXTURE_NAME="incompatible"')
    result = run_python(
        f"""
        import torch_fl
        torch_fl.register_device_plugin(name="sim")
        try:
            torch_fl.register_device_plugin(name="sim", plugin_path={str(plugin)!r})
        except torch_fl.IncompatiblePluginError as e:
            print("refused:", e)
        """,
        env={"TORCH_FL_SIM_STRICT": "1"},
    )
    assert "refused:" in assert_ok(result)
    assert "host-addressable" in result.stdout


@pytest.mark.parametrize("name", ["fx", "nn", "shared", "float"])
def test_names_that_would_shadow_pytorch_attributes_are_refused(name: str) -> None:
    out = assert_ok(
        run_python(
            f"""
            import torch_fl
            try:
                torch_fl.register_device_plugin(name={name!r})
            except torch_fl.InvalidDeviceNameError as e:
                print(e)
            """
        )
    )
    assert f"{name!r} cannot be a device name" in out and "already exists" in out

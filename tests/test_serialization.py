"""torch.save / torch.load of device tensors."""

from __future__ import annotations

import io
import unittest.mock

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_device_tensors_come_back_on_the_device() -> None:
    x = torch.randn(3, 4)
    y = round_trip(x.to("sim:1"))
    assert y.device == torch.device("sim:1")
    assert_close(y, x)


def test_map_location() -> None:
    x = torch.randn(5)
    assert round_trip(x.to(DEVICE), map_location="cpu").device.type == "cpu"
    assert round_trip(x, map_location=DEVICE).device == torch.device("sim:0")


def test_views_keep_sharing_storage() -> None:
    base = torch.arange(10.0).to(DEVICE)
    a, b = round_trip((base, base[2:5]))
    b.fill_(-1)
    assert a[3].item() == -1.0


def test_state_dicts() -> None:
    model = torch.nn.Linear(4, 2).to(DEVICE)
    loaded = round_trip(model.state_dict())
    assert loaded["weight"].device.type == DEVICE
    assert_close(loaded["weight"], model.weight.detach().cpu())


def test_location_tags_and_restore_locations() -> None:
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device=DEVICE)) == "sim:0"
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="sim:1")) == "sim:1"
    cpu_storage = torch.arange(4.0).untyped_storage()
    restored = torch.serialization.default_restore_location(cpu_storage, "sim:1")
    assert restored.device == torch.device("sim:1")
    assert torch.frombuffer(bytearray(restored.cpu()), dtype=torch.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_map_location_to_another_device() -> None:
    x = torch.randn(3, 3)
    y = round_trip(x.to("sim:0"), map_location="sim:1")
    assert y.device == torch.device("sim:1")
    assert_close(y, x)


def test_plain_device_tensors_carry_no_backend_metadata() -> None:
    x = torch.randn(3).to(DEVICE)
    assert torch._utils.get_tensor_metadata(x) == {}
    assert torch._utils.get_tensor_metadata(round_trip(x)) == {}


METADATA = {"version_number": True, "format_number": False}


def test_backend_metadata_round_trips_through_save_and_load(tmp_path) -> None:
    x = torch.randn(3, 3).to(DEVICE)
    torch._utils.set_tensor_metadata(x, METADATA)
    assert torch._utils.get_tensor_metadata(x) == METADATA
    path = tmp_path / "x.pt"
    torch.save(x, path)
    loaded = torch.load(path)
    assert loaded.device == x.device
    assert torch._utils.get_tensor_metadata(loaded) == METADATA
    assert_close(loaded, x.cpu())
    # Weights-only loading (the default) rebuilds through the same hook.
    assert torch._utils.get_tensor_metadata(torch.load(path, weights_only=True)) == METADATA
    # A CPU tensor has no backend to keep it.
    assert torch._utils.get_tensor_metadata(torch.load(path, map_location="cpu")) == {}


def test_backend_metadata_accumulates_and_keeps_pytorchs_own_keys() -> None:
    x = torch.randn(2, dtype=torch.complex64).to(DEVICE).conj()
    torch._utils.set_tensor_metadata(x, {"a": True})
    torch._utils.set_tensor_metadata(x, {"b": False})
    assert torch._utils.get_tensor_metadata(x) == {"conj": True, "a": True, "b": False}


def test_backend_metadata_follows_shallow_copies_of_the_tensor() -> None:
    src = torch.empty(3, device=DEVICE)
    torch._utils.set_tensor_metadata(src, METADATA)
    assert torch._utils.get_tensor_metadata(src.detach()) == METADATA
    assert torch._utils.get_tensor_metadata(torch.nn.Parameter(src)) == METADATA
    # Data derived by an operator is a new tensor: no metadata.
    assert torch._utils.get_tensor_metadata(src + 1) == {}


def test_tensors_without_storage_are_rebuilt_from_the_cpu() -> None:
    # The path PyTorch takes for backends whose tensors have no storage.
    x = torch.randn(2, 3)
    with unittest.mock.patch.object(torch._C, "_has_storage", return_value=False):
        device_x = x.to(DEVICE)
        rebuild = device_x._reduce_ex_internal(torch.serialization.DEFAULT_PROTOCOL)[0]
        assert rebuild is torch._utils._rebuild_device_tensor_from_cpu_tensor
        loaded = round_trip({"x": device_x}, weights_only=True)["x"]
    assert loaded.device == torch.device("sim:0")
    assert_close(loaded, x)

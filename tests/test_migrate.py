"""torch_fl.migrate: opt-in runtime redirection of CUDA code to the plugin device."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import torch_fl

from .conftest import DEVICE, ROOT, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

SCRIPT = ROOT / "tests" / "migration" / "cuda_train.py"


def patched_state() -> dict[str, object]:
    """Every attribute migration may patch, by identity."""
    state: dict[str, object] = {}
    for owner, prefix in (
        (torch.Tensor, "Tensor"),
        (torch.nn.Module, "Module"),
        (torch.cuda, "cuda"),
        (torch, "torch"),
    ):
        for name, value in vars(owner).items():
            state[f"{prefix}.{name}"] = value
    state["autocast.__init__"] = torch.amp.autocast.__init__
    state["GradScaler.__init__"] = torch.amp.GradScaler.__init__
    state["DataLoader.__init__"] = torch.utils.data.DataLoader.__init__
    return state


def test_importing_and_registering_patches_nothing() -> None:
    out = assert_ok(
        run_python(
            f"""
            import torch
            before = {{n: v for n, v in vars(torch.cuda).items()}}
            tensor_to, zeros, load = torch.Tensor.__dict__.get("to"), torch.zeros, torch.load
            import torch_fl
            torch_fl.register_device_plugin(name="{DEVICE}")
            assert {{n: v for n, v in vars(torch.cuda).items()}} == before
            assert (torch.Tensor.__dict__.get("to"), torch.zeros, torch.load) == (tensor_to, zeros, load)
            assert torch_fl.migration_stats() == {{}}
            print("unchanged")
            """
        )
    )
    assert "unchanged" in out


def test_redirects_and_counts() -> None:
    torch_fl.reset_migration_stats()
    with torch_fl.migrate(DEVICE) as migration:
        assert migration.active and migration.device == DEVICE
        x = torch.ones(2).cuda()
        y = torch.zeros(2, device="cuda:0")
        z = torch.ones(2).to(torch.device("cuda"))
        w = x.new_zeros(3, device="cuda")
        model = nn.Linear(2, 2).cuda()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        # Device-agnostic calls are not counted.
        torch.ones(2).to(DEVICE)
        torch.zeros(2, device="cpu")
    assert not migration.active
    for tensor in (x, y, z, w, model.weight):
        assert tensor.device.type == DEVICE
    assert stream.device.type == DEVICE
    assert torch_fl.migration_stats() == {
        "Tensor.cuda": 1,
        "torch.zeros": 1,
        "Tensor.to": 1,
        "Tensor.new_zeros": 1,
        "Module.cuda": 1,
        "torch.cuda.synchronize": 1,
        "torch.cuda.Stream": 1,
    }


def test_undo_restores_every_attribute() -> None:
    before = patched_state()
    migration = torch_fl.migrate(DEVICE)
    try:
        assert torch.Tensor.cuda is not torch._C.TensorBase.cuda
        assert torch.cuda.synchronize is not before["cuda.synchronize"]
    finally:
        migration.undo()
    migration.undo()  # a second undo is a no-op
    assert_restored(before)
    with torch_fl.migrate(DEVICE):
        pass
    assert_restored(before)


def assert_restored(before: dict[str, object]) -> None:
    after = patched_state()
    changed = [name for name, value in before.items() if after.get(name) is not value]
    assert not changed
    # Lazily imported torch submodules may appear; nothing else may be added.
    added = [name for name in after.keys() - before.keys() if not name.startswith("torch.")]
    assert not added


def test_is_available_stays_truthful_unless_asked() -> None:
    truth = (torch.cuda.is_available(), torch.cuda.device_count())
    with torch_fl.migrate(DEVICE):
        assert (torch.cuda.is_available(), torch.cuda.device_count()) == truth
        assert not torch.ones(1).to("cuda").is_cuda
    torch_fl.reset_migration_stats()
    with torch_fl.migrate(DEVICE, report_cuda_available=True):
        assert torch.cuda.is_available()
        assert torch.cuda.device_count() == getattr(torch, DEVICE).device_count()
        assert torch.ones(1).to("cuda").is_cuda
    assert torch_fl.migration_stats()["torch.cuda.is_available"] == 1
    assert torch.cuda.is_available() == truth[0]
    assert not torch.ones(1).to(DEVICE).is_cuda


def test_pytorch_internal_cuda_calls_are_not_redirected() -> None:
    torch_fl.reset_migration_stats()
    with torch_fl.migrate(DEVICE, report_cuda_available=True):
        torch.manual_seed(0)  # calls torch.cuda.manual_seed_all itself
    assert "torch.cuda.manual_seed_all" not in torch_fl.migration_stats()


def test_autocast_grad_scaler_and_load_are_mapped(tmp_path) -> None:
    path = tmp_path / "t.pt"
    torch.save({"w": torch.ones(2)}, path)
    torch_fl.reset_migration_stats()
    with torch_fl.migrate(DEVICE):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16) as ctx:
            assert ctx.device == DEVICE
        assert torch.amp.GradScaler()._device == DEVICE
        assert torch.load(path, map_location="cuda")["w"].device.type == DEVICE
        assert torch.load(path)["w"].device.type == "cpu", "CPU checkpoints stay on the CPU"
    stats = torch_fl.migration_stats()
    assert stats["torch.autocast(device_type='cuda')"] == 1
    assert stats["torch.amp.GradScaler('cuda')"] == 1
    assert stats["torch.load(map_location='cuda')"] == 1


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match=r"register_device_plugin\(name='npu'\)"):
        torch_fl.migrate("npu")
    with torch_fl.migrate(DEVICE), pytest.raises(RuntimeError, match="already active"):
        torch_fl.migrate(DEVICE)


def test_third_party_cuda_script_trains_on_the_plugin_unchanged() -> None:
    out = assert_ok(
        run_python(
            f"""
            import json, runpy
            import torch_fl
            torch_fl.register_device_plugin(name="{DEVICE}")
            with torch_fl.migrate("{DEVICE}"):
                runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
            print(json.dumps(torch_fl.migration_stats()))
            """,
            timeout=300,
        )
    )
    *_, summary_line, stats_line = out.strip().splitlines()
    summary, stats = json.loads(summary_line), json.loads(stats_line)
    assert summary["param_device"] == f"{DEVICE}:0"
    assert summary["bias_device"] == summary["loaded_device"] == summary["stream_device"] == f"{DEVICE}:0"
    assert summary["last_loss"] < summary["first_loss"], "it trained"
    assert summary["allocated"] > 0
    assert summary["cuda_available"] is torch.cuda.is_available(), "is_available stayed truthful"
    assert stats["Module.cuda"] == 1
    assert stats["Tensor.cuda"] == 20  # 4 batches x 5 epochs
    assert stats["Tensor.to"] == 20
    assert stats["torch.zeros"] == 1
    for name in (
        "torch.cuda.manual_seed_all",
        "torch.cuda.set_device",
        "torch.cuda.Stream",
        "torch.cuda.synchronize",
        "torch.cuda.memory_allocated",
        "torch.amp.GradScaler('cuda')",
        "torch.load(map_location='cuda')",
    ):
        assert stats[name] == 1, name
    assert stats["torch.cuda.Event"] == 2
    assert stats["torch.autocast(device_type='cuda')"] == 20


@pytest.mark.skipif(torch.cuda.is_available(), reason="the script runs as written where CUDA exists")
def test_the_script_needs_cuda_without_migration() -> None:
    result = run_python(f"import runpy; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')", timeout=300)
    assert result.returncode != 0
    assert "CUDA" in result.stderr or "NVIDIA" in result.stderr

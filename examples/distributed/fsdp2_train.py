"""Sharded data-parallel training with FSDP2 (``fully_shard``), on any device type.

The same script as on CUDA but for the device string::

    torchrun --nproc-per-node 2 examples/distributed/fsdp2_train.py --device sim
    torchrun --nproc-per-node 2 examples/distributed/fsdp2_train.py --device cuda

(``TRAIN_DEVICE`` sets the default device.) Across hosts, the usual
``torchrun --nnodes 2 --node-rank N --master-addr HOST ...`` on each.
Parameters are sharded over a one-dimensional ``DeviceMesh`` of the device
type; each layer all-gathers its parameters for forward and backward and
reduce-scatters its gradients. No ``set_device`` on a torch-fl device:
``init_process_group(device_id=...)`` binds the group to the rank's device
and makes it current, which FSDP2 needs (it places parameters and makes its
all-gather and reduce-scatter streams on the current device); CUDA's
``device_id`` does not, so there the script sets it. ``--check`` verifies that the
full parameters are equal on every rank and equal to one process training
on the full batch.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

BATCH_PER_RANK = 8


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's full batch (every rank builds it and takes its slice)."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(world * BATCH_PER_RANK, 16, generator=g), torch.randint(
        0, 4, (world * BATCH_PER_RANK,), generator=g
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TRAIN_DEVICE", "cuda"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="compare with one process on the full batch")
    args = parser.parse_args()

    if args.device not in {"cuda", "cpu", "xpu", "mps"}:
        import torch_fl

        torch_fl.register_device_plugin(name=args.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device, local_rank)
    dist.init_process_group(device_id=device)
    if args.device in {"cuda", "xpu", "mps"}:
        # FSDP2 works on the current device; torch-fl's device_id makes the
        # bound device current, these runtimes' process groups do not.
        torch.accelerator.set_device_index(local_rank)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(args.device, (world,))

    torch.manual_seed(0)
    reference = make_model()
    model = copy.deepcopy(reference).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)

    for step in range(args.steps):
        x, y = batch(step, world)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[rows].to(device)), y[rows].to(device))
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    if args.check:
        check(model, reference, args.steps, world)
    dist.destroy_process_group()


def check(model: nn.Module, reference: nn.Module, steps: int, world: int) -> None:
    """Full parameters equal across ranks and to one process trained on the full batches."""
    # full_tensor() all-gathers each sharded parameter (a DTensor).
    mine = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]).cpu()
    every: list[torch.Tensor] = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather_object(every, mine)
    for r, theirs in enumerate(every):
        torch.testing.assert_close(theirs, mine, rtol=0, atol=0, msg=f"rank {r} differs")
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step, world)
        opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-5)
    if dist.get_rank() == 0:
        print("parameters match one process on the full batch", flush=True)


if __name__ == "__main__":
    main()

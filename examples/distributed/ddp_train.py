"""Data-parallel training with DistributedDataParallel, on any device type.

The same script as on CUDA but for the device string::

    torchrun --nproc-per-node 2 examples/distributed/ddp_train.py --device sim
    torchrun --nproc-per-node 2 examples/distributed/ddp_train.py --device cuda

(``TRAIN_DEVICE`` sets the default device.) Across hosts, the usual
``torchrun --nnodes 2 --node-rank N --master-addr HOST ...`` on each.
A device that is not one of PyTorch's own is registered with torch-fl
first; ``init_process_group`` then picks its c10d backend from
``device_id`` (``"tfl"`` for torch-fl devices, NCCL for CUDA) and binds the
group to ``<device>:LOCAL_RANK``: no ``set_device`` call is needed, the
model and batches name their device. ``--check`` verifies that the
parameters are equal on every rank and equal to one process training on
the full batch.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH_PER_RANK = 8


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)
        self.unused = nn.Linear(4, 4)  # never in forward: DDP's find_unused_parameters marks it ready

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def batch(step: int, micro: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of a step's micro-batch (every rank builds it and takes its slice)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(world * BATCH_PER_RANK, 16, generator=g)
    y = torch.randint(0, 4, (world * BATCH_PER_RANK,), generator=g)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TRAIN_DEVICE", "cuda"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    parser.add_argument("--check", action="store_true", help="compare with one process on the full batch")
    args = parser.parse_args()

    if args.device not in {"cuda", "cpu", "xpu", "mps"}:
        import torch_fl

        torch_fl.register_device_plugin(name=args.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device, local_rank)
    # No set_device: device_id binds the process group (and its communicator)
    # to this rank's device; tensors name their device explicitly.
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    reference = Net()
    model = copy.deepcopy(reference).to(device)
    # A tiny bucket size: several gradient buckets even for this small model.
    # (Dynamo's DDPOptimizer wants the default bucket sizes.)
    ddp = DDP(
        model, device_ids=[local_rank], bucket_cap_mb=None if args.compile else 0.005, find_unused_parameters=True
    )
    net = torch.compile(ddp, backend="aot_eager") if args.compile else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rows = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)

    for step in range(args.steps):
        opt.zero_grad()
        # Two micro-batches: the first accumulates locally (no_sync), the
        # second all-reduces the sum.
        for micro in range(2):
            x, y = batch(step, micro, world)
            with ddp.no_sync() if micro == 0 else contextlib.nullcontext():
                loss = F.cross_entropy(net(x[rows].to(device)), y[rows].to(device))
                loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    if args.check:
        check(model, reference, args.steps, world)
    dist.destroy_process_group()


def check(model: nn.Module, reference: nn.Module, steps: int, world: int) -> None:
    """Parameters equal across ranks and to one process trained on the full batches."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather_object(every, mine)
    for r, theirs in enumerate(every):
        torch.testing.assert_close(theirs, mine, rtol=0, atol=0, msg=f"rank {r} differs")
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(2):
            x, y = batch(step, micro, world)
            F.cross_entropy(reference(x), y).backward()
        opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-5)
    if dist.get_rank() == 0:
        print("parameters match one process on the full batch", flush=True)


if __name__ == "__main__":
    main()

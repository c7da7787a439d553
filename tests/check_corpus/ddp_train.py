"""torchrun --nproc-per-node 8 ddp_train.py: data-parallel training, NCCL and CUDA hard-coded."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup() -> int:
    dist.init_process_group("nccl")  # expect: FL005
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # expect: FL021
    return local_rank


def main() -> None:
    local_rank = setup()
    device = torch.device(f"cuda:{local_rank}")  # expect: FL001
    model = nn.Linear(32, 4).to(device)
    model = DDP(model, device_ids=[local_rank])
    data = TensorDataset(torch.randn(256, 32), torch.randn(256, 4))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler, pin_memory=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=torch.cuda.is_available())  # expect: FL007
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()  # expect: FL022
        if dist.get_rank() == 0:
            print(f"epoch {epoch} done on {torch.cuda.device_count()} GPUs")  # expect: FL021
    dist.barrier(device_ids=[local_rank])
    dist.destroy_process_group()


def new_subgroup(ranks: list[int]) -> dist.ProcessGroup:
    return dist.new_group(ranks, backend="nccl")  # expect: FL005


if __name__ == "__main__":
    main()

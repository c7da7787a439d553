"""Command-line options and helpers seen in research repositories."""

import argparse

import torch
from torch import nn


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="train on cuda or cpu")
    parser.add_argument("--device", default="cuda", help="cuda or cpu")  # expect: FL001
    parser.add_argument("--name", default="cuda-run", help="experiment name")
    return parser.parse_args()


def pick_device(args: argparse.Namespace) -> str:
    dev = "cuda:0"  # expect: FL001
    device_type = "cuda" if "cuda" in args.device else "cpu"  # expect: FL002
    if args.device.startswith("cuda"):  # expect: FL002
        return dev
    return device_type


def build(args: argparse.Namespace) -> nn.Module:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # expect: FL002
    torch.set_default_device("cuda")  # expect: FL001
    model = nn.Linear(4, 4).to(device)
    if torch.cuda.device_count() > 1:  # expect: FL021
        model = nn.DataParallel(model)  # expect: FL050
    opt = torch.optim.Adam(model.parameters(), fused=args.device == "cuda")  # expect: FL007
    del opt
    if args.device == "cuda":  # expect: FL002
        print("cuda selected")
    weights = torch.cuda.FloatTensor(4)  # expect: FL030
    del weights
    return model


def is_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"  # expect: FL002


def uses_cuda(devices: list[str]) -> bool:
    return any(d == "cuda" for d in devices)  # expect: FL002

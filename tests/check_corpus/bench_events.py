"""Micro-benchmark of a matmul, timed with CUDA events on a side stream."""

import time

import torch
from torch import cuda

DEVICE = "cuda"  # expect: FL001


def bench(n: int = 2048, iters: int = 20) -> float:
    a = torch.randn(n, n, device=DEVICE)
    b = torch.randn(n, n, device=DEVICE)
    start = torch.cuda.Event(enable_timing=True)  # expect: FL025
    end = cuda.Event(enable_timing=True)  # expect: FL025
    stream = torch.cuda.Stream()  # expect: FL024
    stream.wait_stream(torch.cuda.current_stream())  # expect: FL024
    with torch.cuda.stream(stream):  # expect: FL024
        start.record()
        for _ in range(iters):
            a @ b
        end.record()
    torch.cuda.synchronize()  # expect: FL022
    return start.elapsed_time(end) / iters


def bench_graph(a: torch.Tensor) -> torch.Tensor:
    graph = torch.cuda.CUDAGraph()  # expect: FL029
    with torch.cuda.graph(graph):  # expect: FL029
        out = a * 2
    graph.replay()
    return out


def report() -> None:
    name = torch.cuda.get_device_name(0)  # expect: FL021
    major, minor = torch.cuda.get_device_capability()  # expect: FL027
    free, total = torch.cuda.mem_get_info()  # expect: FL023
    torch.cuda.reset_peak_memory_stats()  # expect: FL023
    t0 = time.perf_counter()
    ms = bench()
    wall = time.perf_counter() - t0
    print(f"{name} (sm_{major}{minor}): {ms:.3f} ms per matmul, {wall:.1f} s wall, {free / total:.0%} free")
    try:
        torch.empty(1 << 40, device="cuda")  # expect: FL001
    except torch.cuda.OutOfMemoryError:  # expect: FL031
        print("out of cuda memory, as expected")


if __name__ == "__main__":
    torch.cuda.manual_seed(0)  # expect: FL026
    report()

"""torch.distributed on the simulated device: all_reduce bus bandwidth and DDP step time.

Run: ``python benches/python/bench_distributed.py`` (spawns its own ranks on
loopback). Prints, for 2 ranks and sizes 1 KiB to 64 MiB, the all_reduce bus
bandwidth (``2 (n-1)/n * bytes / time``, NCCL-tests' definition) of:

- ``gloo-cpu``: gloo on host tensors (the floor the staged path builds on);
- ``staged``: the "tfl" backend on device tensors through host copies and gloo
  (``TORCH_FL_DIST_STAGED=1``);
- ``native``: the "tfl" backend on the plugin's own collectives, when the
  plugin and the extension offer them (skipped otherwise);

and the DDP step time of a small MLP on 2 ranks against 1 rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist, torch_fl
torch_fl.register_device_plugin(name="sim")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mode = os.environ["BENCH_MODE"]
dev = torch.device("sim", rank) if mode != "gloo-cpu" else torch.device("cpu")
if dev.type == "sim":
    torch.sim.set_device(dev)
dist.init_process_group("gloo" if mode == "gloo-cpu" else "tfl", device_id=dev if dev.type == "sim" else None)
if mode == "native":
    from torch_fl.distributed._backend import TorchFLBackend
    if dist.group.WORLD._get_backend(dev).transport != "native":
        print(json.dumps({"skipped": "no native collectives"})); sys.exit(0)
results = {}
if mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(dev)
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(32, 512, device=dev)
    times = []
    for i in range(25):
        start = time.perf_counter()
        opt.zero_grad(); net(x).sum().backward(); opt.step(); torch.sim.synchronize()
        if i >= 5: times.append(time.perf_counter() - start)
    results["step_ms"] = sorted(times)[len(times) // 2] * 1e3
else:
    for size in json.loads(os.environ["BENCH_SIZES"]):
        t = torch.ones(size // 4, device=dev)
        iters = max(3, min(50, (8 << 20) // size))
        for _ in range(2): dist.all_reduce(t)
        if dev.type == "sim": torch.sim.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters): dist.all_reduce(t)
        if dev.type == "sim": torch.sim.synchronize()
        elapsed = (time.perf_counter() - start) / iters
        results[size] = 2 * (world - 1) / world * size / elapsed / 1e9
if rank == 0:
    print(json.dumps(results))
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(mode: str, world: int = 2, sizes: list[int] = SIZES) -> dict[str, float]:
    """Runs the worker on ``world`` ranks and returns rank 0's figures."""
    port = _port()
    env = {**os.environ, "BENCH_MODE": mode, "BENCH_SIZES": json.dumps(sizes), "MASTER_ADDR": "127.0.0.1"}
    env.update({"MASTER_PORT": str(port), "WORLD_SIZE": str(world)})
    if mode == "staged":
        env["TORCH_FL_DIST_STAGED"] = "1"
        env["TORCH_FL_DIST_CHECK"] = "0"  # measure the transport, not the shape check
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", textwrap.dedent(WORKER)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        out = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise SystemExit(f"{mode}: a rank failed")
    result: dict[str, float] = json.loads(out[0].strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes (1 KiB, 1 MiB): a CI-size run")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    sizes = [1 << 10, 1 << 20] if args.quick else SIZES
    start = time.perf_counter()
    table = {mode: run(mode, sizes=sizes) for mode in ("gloo-cpu", "staged", "native")}
    one, two = run("ddp", world=1)["step_ms"], run("ddp", world=2)["step_ms"]
    if args.json:
        print(json.dumps({"busbw_gbps": table, "ddp_step_ms": {"1": one, "2": two}}))
        return
    print("all_reduce bus bandwidth, 2 ranks (GB/s)")
    print(f"{'size':>10} " + " ".join(f"{m:>10}" for m in table))
    for size in sizes:
        cells = []
        for figures in table.values():
            value = figures.get(str(size))
            cells.append(f"{value:10.3f}" if value is not None else f"{'-':>10}")
        label = f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB"
        print(f"{label:>10} " + " ".join(cells))
    print(f"DDP step (4x Linear(512), batch 32 per rank): 1 rank {one:.2f} ms, 2 ranks {two:.2f} ms")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

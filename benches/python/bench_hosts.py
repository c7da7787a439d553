"""torch.distributed across two hosts: all_reduce bus bandwidth over a veth link.

Run as root: ``python benches/python/bench_hosts.py [--json] [--quick]``.
The two "hosts" are network namespaces on this machine joined by a veth
pair (198.18.0.1 and 198.18.0.2, see tests/_netns.py), one rank in each
(world 2, each on its device 0), so every byte crosses the link as between
machines (a veth pair is a memory copy in the kernel: the figures are an
upper bound of what the software adds, not of a network). For sizes 1 KiB
to 64 MiB (powers of 4), it prints the all_reduce bus bandwidth
(``2 (n-1)/n * bytes / time``, NCCL-tests' definition) of:

- ``native``: the "tfl" backend on the plugin's own collectives
  (``TORCH_FL_DIST_STAGED=0``), the simulator's transport across the link;
- ``staged``: the "tfl" backend through host copies and gloo
  (``TORCH_FL_DIST_STAGED=1``);
- ``gloo-cpu``: gloo on host tensors, the floor the staged path builds on.

Each size is all-reduced twice to warm up, then timed in three rounds of
several iterations, each up to a device synchronization; the median round
counts. A transport that fails (or is
not offered by the plugin) shows ``-`` and its reason. Making namespaces
needs root: without it the benchmark says so and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tests import _netns  # noqa: E402 - the repository root is on the path only from here

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
MODES = ("native", "staged", "gloo-cpu")
PORT = 29500  # each namespace is empty: any port is free

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist, torch_fl
torch_fl.register_device_plugin(name="sim")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mode = os.environ["BENCH_MODE"]
dev = torch.device("cpu") if mode == "gloo-cpu" else torch.device("sim", int(os.environ["LOCAL_RANK"]))
if dev.type == "cpu":
    dist.init_process_group("gloo")
else:
    dist.init_process_group(device_id=dev)
    transport = dist.group.WORLD._get_backend(dev).transport
    if transport != mode:
        print(json.dumps({"skipped": f"the backend chose the {transport} transport"}))
        sys.exit(0)

def sync():
    if dev.type != "cpu":
        torch.accelerator.synchronize(dev)

results = {}
for size in json.loads(os.environ["BENCH_SIZES"]):
    t = torch.ones(size // 4, device=dev)
    iters = max(5, min(50, (16 << 20) // size))
    for _ in range(2):
        dist.all_reduce(t)
    sync()
    rounds = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        rounds.append((time.perf_counter() - start) / iters)
    seconds = sorted(rounds)[1]  # the median round
    results[size] = {"busbw_gbps": 2 * (world - 1) / world * size / seconds / 1e9, "us": seconds * 1e6,
                     "iters": iters}
if rank == 0:
    print(json.dumps({"results": results}))
dist.destroy_process_group()
"""


def run(hosts: tuple[_netns.Host, _netns.Host], mode: str, sizes: list[int], timeout: float) -> dict[str, Any]:
    """One rank per host; returns rank 0's figures, or ``{"failed"/"skipped": reason}``."""
    procs = []
    for rank, host in enumerate(hosts):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
        env.pop("TORCH_FL_SIM_SOCKET_IFNAME", None)  # the default: the interface routing to MASTER_ADDR
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": str(len(hosts)),
                "MASTER_ADDR": hosts[0].address,
                "MASTER_PORT": str(PORT),
                "GLOO_SOCKET_IFNAME": host.ifname,
                "BENCH_MODE": mode,
                "BENCH_SIZES": json.dumps(sizes),
                "TORCH_FL_DIST_STAGED": "1" if mode == "staged" else "0",
                "TORCH_FL_DIST_CHECK": "0",  # measure the transport, not the shape check
            }
        )
        argv = [sys.executable, "-W", "ignore", "-c", textwrap.dedent(WORKER)]
        procs.append(_netns.spawn(host, argv, env=env))
    results = _netns.finish(procs, timeout)
    for rank, result in enumerate(results):
        if result.returncode != 0:
            what = "timed out" if result.returncode is None else f"exited with {result.returncode}"
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            return {"failed": f"rank {rank} {what}: {tail}"}
    lines = results[0].stdout.strip().splitlines()
    figures: dict[str, Any] = json.loads(lines[-1]) if lines else {"failed": "rank 0 printed nothing"}
    return figures


def _label(size: int) -> str:
    return f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes (1 KiB, 1 MiB): a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="the transports to measure")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each transport may take (default 600)")
    args = parser.parse_args()
    reason = _netns.skip_reason()
    if reason is not None:
        raise SystemExit(f"bench_hosts.py cannot run here: it needs {reason}")
    sizes = [1 << 10, 1 << 20] if args.quick else SIZES
    start = time.perf_counter()
    table: dict[str, dict[str, Any]] = {}
    with _netns.two_hosts() as hosts:
        for mode in args.modes:
            print(f"bench_hosts: {mode} ...", file=sys.stderr, flush=True)
            table[mode] = run(hosts, mode, sizes, args.timeout)
    if args.json:
        print(
            json.dumps(
                {
                    "world": 2,
                    "link": "veth",
                    "busbw_gbps": {
                        m: {s: v["busbw_gbps"] for s, v in f.get("results", {}).items()} for m, f in table.items()
                    },
                    "time_us": {m: {s: v["us"] for s, v in f.get("results", {}).items()} for m, f in table.items()},
                    "unavailable": {
                        m: f.get("failed") or f.get("skipped") for m, f in table.items() if "results" not in f
                    },
                }
            )
        )
        return
    print("all_reduce across two hosts (network namespaces joined by veth), 1 rank each")
    print(
        f"{'':>10} "
        + f"{'bus bandwidth (GB/s)':^{11 * len(table) - 1}}"
        + "  "
        + f"{'time (us)':^{11 * len(table) - 1}}"
    )
    print(f"{'size':>10} " + " ".join(f"{m:>10}" for m in table) + "  " + " ".join(f"{m:>10}" for m in table))
    for size in sizes:
        rows = [figures.get("results", {}).get(str(size)) for figures in table.values()]
        bw = " ".join(f"{r['busbw_gbps']:10.4f}" if r else f"{'-':>10}" for r in rows)
        us = " ".join(f"{r['us']:10.0f}" if r else f"{'-':>10}" for r in rows)
        print(f"{_label(size):>10} {bw}  {us}")
    for mode, figures in table.items():
        if "results" not in figures:
            print(f"{mode}: {figures.get('failed') or figures.get('skipped')}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

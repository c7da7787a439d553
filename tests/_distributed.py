"""Launching a snippet on several ranks (processes) for the torch.distributed tests.

Each rank is a fresh interpreter on loopback with the usual ``torchrun``
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), registers the simulated accelerator as ``"sim"`` and runs
the snippet with ``rank``, ``world`` and ``dev`` (``sim:<rank>``) defined.
No rank calls ``set_device``: as with NCCL, a group bound with
``device_id`` and the tensors of each collective say which device it runs
on, and the current device stays ``sim:0`` on every rank.
Every rank is bounded by a timeout; on failure or timeout every rank still
running is killed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

PRELUDE = """
import os, sys, datetime
import torch
import torch.distributed as dist
import torch_fl
torch_fl.register_device_plugin(name="sim")
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = torch.device("sim", int(os.environ["LOCAL_RANK"]))
"""


@dataclass
class Rank:
    """What one rank printed and how it ended (``returncode`` None: killed at the timeout)."""

    returncode: int | None
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    body: str, world: int = 2, timeout: float = 120, env: dict[str, str] | None = None, ranks: list[int] | None = None
) -> list[Rank]:
    """Runs ``body`` on ``ranks`` (default: all of ``world``) and returns each rank's result."""
    port = free_port()
    code = PRELUDE + textwrap.dedent(body)
    procs = []
    for rank in ranks if ranks is not None else range(world):
        rank_env = {
            **os.environ,
            **(env or {}),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
                results.append(Rank(p.returncode, out, err))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                results.append(Rank(None, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def assert_all_ok(results: list[Rank]) -> list[str]:
    """Asserts every rank exited 0 and returns their stdouts."""
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r}: exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return [res.stdout for res in results]

"""torch.distributed across two hosts: two network namespaces on this machine (tests/_netns.py).

Each "host" is a network namespace with its own address (198.18.0.1 and
198.18.0.2, joined by a veth pair) and nothing but ``lo`` besides, so every
connection between the ranks of different hosts crosses the veth link, as
between machines. Making namespaces needs root: the tests skip with the
reason otherwise (CI runs as root).

- Training: ``torchrun --nnodes 2 --nproc-per-node 2`` on each host (static
  rendezvous on host a) runs the DDP and the FSDP2 example with ``--check``
  (parameters equal on every rank and to one process on the full batch).
  No ``set_device``: the ranks with LOCAL_RANK 1 rely on ``device_id=sim:1``
  alone, which binds their groups and makes the device current for FSDP2.
- Fault: the link goes down while the ranks all-reduce in a loop; every rank
  raises a distributed error after the process group's timeout and every
  process, the torchrun agents included, ends. One rank per host there:
  with two, torchrun would SIGTERM a rank's sibling as soon as the first
  one failed, and the test could not tell that each rank raises by itself.

Both on the native transport (the plugin's collectives, the default) and on
the staged one (``TORCH_FL_DIST_STAGED=1``: host copies and gloo). gloo
(the staged path, torchrun's own groups) is told the interface with
``GLOO_SOCKET_IFNAME``; the simulator's transport picks the interface that
routes to ``MASTER_ADDR`` by itself. Every process is bounded by a timeout
that turns a hang into a failure, and the namespaces are removed with every
process inside, whatever happens.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_fl.distributed import python_backends_supported

from . import _netns
from ._netns import Host, Proc
from .conftest import ROOT

pytestmark = pytest.mark.skipif(
    not python_backends_supported(),
    reason="this torch's c10d Backend cannot be subclassed from Python (torch 2.13): the backend needs torch >= 2.14",
)

TRANSPORTS = {"native": {"TORCH_FL_DIST_STAGED": "0"}, "staged": {"TORCH_FL_DIST_STAGED": "1"}}
PORT = 29500  # each namespace is empty: any port is free
EXAMPLES = ROOT / "examples" / "distributed"

# All-reduces until the link goes down. Each rank reports progress through a
# file once its collectives cross the link; the loop's host read (a loss's
# .item() in training) is where a failed collective surfaces.
ALL_REDUCE_LOOP = """
import datetime, os, pathlib, sys
import torch, torch.distributed as dist, torch_fl
torch_fl.register_device_plugin(name="sim")
rank = int(os.environ["RANK"])
dev = torch.device("sim", int(os.environ["LOCAL_RANK"]))
dist.init_process_group(device_id=dev, timeout=datetime.timedelta(seconds=15))
t = torch.ones(1024, device=dev)
for i in range(1_000_000):
    dist.all_reduce(t)
    t.div_(dist.get_world_size()).cpu()
    if i == 3:
        pathlib.Path(os.environ["PROGRESS_DIR"], f"rank{rank}").write_text("running")
sys.exit("the link went down and the collectives went on")
"""

# Inherited variables a launcher of the test run might have set: each host
# gets its own.
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_DIST_ERROR = re.compile(r"DistBackendError|DistNetworkError|DistError|AcceleratorError")
_TIMEOUT = re.compile(r"time(d)? ?out|abort", re.IGNORECASE)


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    reason = _netns.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with _netns.two_hosts() as pair:
        yield pair


def _env(host: Host, transport: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC")}
    env.pop("TORCH_FL_SIM_SOCKET_IFNAME", None)  # the default: the interface that routes to MASTER_ADDR
    env.pop("TORCH_FL_SIM_COLL_TIMEOUT", None)  # the group's timeout applies
    # Each host a machine with 2 devices (the simulator's default), one per
    # local rank, whatever the caller's TORCH_FL_SIM_DEVICES.
    env["TORCH_FL_SIM_DEVICES"] = "2"
    return {**env, **TRANSPORTS[transport], "GLOO_SOCKET_IFNAME": host.ifname, **extra}


def _torchrun(hosts: tuple[Host, Host], nproc: int, argv: list[str], env: dict[str, str]) -> list[Proc]:
    """One torchrun agent per host (node rank = host index), static rendezvous on the first host."""
    procs = []
    for node, host in enumerate(hosts):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts))]
        cmd += ["--nproc-per-node", str(nproc), "--node-rank", str(node), "--max-restarts", "0"]
        cmd += ["--master-addr", hosts[0].address, "--master-port", str(PORT), *argv]
        procs.append(_netns.spawn(host, cmd, env=_env(host, **env)))
    return procs


# One torchrun per example: both in one process (init, destroy, init again
# on torchrun's agent store) is not reliable (a rank of the second group can
# find the first group's keys under the same store prefix and wait forever).
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("example", ["ddp_train.py", "fsdp2_train.py"])
def test_training_across_two_hosts(hosts: tuple[Host, Host], example: str, transport: str) -> None:
    argv = [str(EXAMPLES / example), "--device", "sim", "--steps", "3", "--check"]
    results = _netns.finish(_torchrun(hosts, 2, argv, {"transport": transport}), timeout=200)
    for node, result in enumerate(results):
        # torchrun's exit code is non-zero when any of its ranks failed.
        assert result.returncode == 0, f"host {node}: {result.describe()}"
        assert not _netns.pids(hosts[node]), f"host {node}: processes left behind"
    # Global rank 0 (host a, local rank 0) prints the check's verdict.
    assert "parameters match one process on the full batch" in results[0].stdout, results[0].describe()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_link_down_fails_every_rank(hosts: tuple[Host, Host], transport: str, tmp_path: Path) -> None:
    script = tmp_path / "all_reduce_loop.py"
    script.write_text(ALL_REDUCE_LOOP)
    progress = tmp_path / "progress"
    progress.mkdir()
    # The group's timeout reaches the simulator's communicator through the
    # ABI's communicator settings (no TORCH_FL_SIM_COLL_TIMEOUT override).
    env = {"transport": transport, "PROGRESS_DIR": str(progress)}
    procs = _torchrun(hosts, 1, [str(script)], env)
    why = None
    try:
        deadline = time.monotonic() + 90
        while len(list(progress.iterdir())) < 2 and why is None:
            if any(p.popen.poll() is not None for p in procs):
                why = "a torchrun exited before the link went down"
            elif time.monotonic() > deadline:
                why = "the ranks made no progress within 90 s"
            time.sleep(0.2)
        if why is None:
            _netns.set_link(hosts[0], up=False)
    finally:
        results = _netns.finish(procs, timeout=120 if why is None else 0)
    if why is not None:
        pytest.fail(f"{why}:\n" + "\n".join(r.describe() for r in results))
    for node, result in enumerate(results):
        assert result.returncode is not None, f"host {node} hung after the link went down: {result.describe()}"
        assert result.returncode != 0, f"host {node}: {result.describe()}"
        assert not _netns.pids(hosts[node]), f"host {node}: processes left behind"
        # The rank's uncaught exception, as torch.distributed prints it
        # (lines prefixed [rank<N>]:, N the host's index with one rank per
        # host) and torchrun passes on: a distributed or stream error that
        # names the timeout or the communicator's abort.
        errors = re.findall(rf"^\[rank{node}\]: .*(?:{_DIST_ERROR.pattern}).*$", result.stderr, re.MULTILINE)
        assert any(_TIMEOUT.search(line) for line in errors), f"host {node}: {result.describe()}"

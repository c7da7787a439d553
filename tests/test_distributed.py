"""torch.distributed on the simulated device: the "tfl" c10d backend, 2 ranks on loopback.

Each test launches the ranks as fresh processes (tests/_distributed.py),
bounded by a timeout, and kills them on failure. The simulated plugin has a
collectives table (ABI 1.3), so the backend's default transport is
**native** (the plugin's collectives over its loopback transport);
``TORCH_FL_DIST_STAGED=1`` selects the **staged** transport (host copies and
gloo) that plugins without collectives get. The tests that check results or
faults run on both. Only the collectives test exercises enough of the device
runtime to be worth the strict and sync passes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from torch_fl.distributed import python_backends_supported

from ._distributed import assert_all_ok, free_port, launch
from .conftest import ROOT

pytestmark = pytest.mark.skipif(
    not python_backends_supported(),
    reason="this torch's c10d Backend cannot be subclassed from Python (torch 2.13): the backend needs torch >= 2.14",
)

STAGED = {"TORCH_FL_DIST_STAGED": "1"}
NATIVE = {"TORCH_FL_DIST_STAGED": "0"}
TRANSPORTS = {"native": NATIVE, "staged": STAGED}

COLLECTIVES = """
dist.init_process_group(device_id=dev)
from torch_fl.distributed._backend import TorchFLBackend
backend = dist.group.WORLD._get_backend(dev)
transport = os.environ["EXPECT_TRANSPORT"]
assert isinstance(backend, TorchFLBackend) and backend.transport == transport, backend
assert dist.get_backend() == "tfl", dist.get_backend()

def mine(r, dtype=torch.float32, n=6):
    return (torch.arange(n, dtype=torch.float64) * (r + 1) + r).to(dtype)

ranks = list(range(world))
cases = {"sum": sum, "prod": lambda ts: torch.stack(ts).prod(0), "min": lambda ts: torch.stack(ts).min(0).values,
         "max": lambda ts: torch.stack(ts).max(0).values, "avg": lambda ts: sum(ts) / world}
ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
       "avg": dist.ReduceOp.AVG}
for name, ref in cases.items():
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        if name == "avg" and not dtype.is_floating_point:
            continue
        t = mine(rank, dtype).to(dev)
        dist.all_reduce(t, op=ops[name])
        torch.testing.assert_close(t.cpu(), ref([mine(r, dtype) for r in ranks]).to(dtype), msg=f"{name} {dtype}")

# async work: the future holds the reduced tensor
t = mine(rank).to(dev)
work = dist.all_reduce(t, async_op=True)
value = work.get_future().wait()
work.wait()
torch.testing.assert_close(value[0].cpu(), sum(mine(r) for r in ranks))

flags = torch.tensor([rank == 0, True], device=dev)
dist.all_reduce(flags, op=dist.ReduceOp.MAX)
assert flags.cpu().tolist() == [True, True]

t = mine(rank).to(dev)
dist.broadcast(t, src=1)
torch.testing.assert_close(t.cpu(), mine(1))

t = mine(rank).to(dev)
dist.reduce(t, dst=0)
torch.testing.assert_close(t.cpu(), sum(mine(r) for r in ranks) if rank == 0 else mine(rank))

outs = [torch.empty(6, device=dev) for _ in ranks]
dist.all_gather(outs, mine(rank).to(dev))
for r in ranks:
    torch.testing.assert_close(outs[r].cpu(), mine(r))

big = torch.empty(world * 6, device=dev)
dist.all_gather_into_tensor(big, mine(rank).to(dev))
torch.testing.assert_close(big.cpu(), torch.cat([mine(r) for r in ranks]))

full = [mine(rank, n=8) for _ in ranks]
out = torch.empty(8, device=dev)
dist.reduce_scatter(out, [f.to(dev) for f in full])
torch.testing.assert_close(out.cpu(), sum(mine(r, n=8) for r in ranks))

out = torch.empty(4, device=dev)
dist.reduce_scatter_tensor(out, mine(rank, n=8).to(dev))
torch.testing.assert_close(out.cpu(), sum(mine(r, n=8) for r in ranks).chunk(world)[rank])

# all_to_all_single, even and uneven splits
out = torch.empty(8, device=dev)
dist.all_to_all_single(out, mine(rank, n=8).to(dev))
torch.testing.assert_close(out.cpu(), torch.cat([mine(r, n=8).chunk(world)[rank] for r in ranks]))
in_splits = [1, 3] if rank == 0 else [2, 2]
out_splits = [[1, 3], [2, 2]][0][rank], [[1, 3], [2, 2]][1][rank]
out = torch.empty(sum(out_splits), device=dev)
dist.all_to_all_single(out, mine(rank, n=4).to(dev), list(out_splits), in_splits)
pieces = [mine(r, n=4).split([[1, 3], [2, 2]][r])[rank] for r in ranks]
torch.testing.assert_close(out.cpu(), torch.cat(pieces))

# send/recv: rank 0 -> rank 1
if rank == 0:
    dist.send(mine(0, n=5).to(dev), dst=1)
else:
    t = torch.empty(5, device=dev)
    dist.recv(t, src=0)
    torch.testing.assert_close(t.cpu(), mine(0, n=5))

# gather / scatter
g = [torch.empty(6, device=dev) for _ in ranks] if rank == 0 else None
dist.gather(mine(rank).to(dev), g, dst=0)
if rank == 0:
    for r in ranks:
        torch.testing.assert_close(g[r].cpu(), mine(r))
t = torch.empty(6, device=dev)
dist.scatter(t, [mine(r).to(dev) for r in ranks] if rank == 1 else None, src=1)
torch.testing.assert_close(t.cpu(), mine(rank))

# functional collectives (what DTensor and FSDP2 use) and coalesced all-reduce
import torch.distributed._functional_collectives as funcol
r = funcol.all_reduce(mine(rank).to(dev), "sum", dist.group.WORLD)
torch.testing.assert_close(r.cpu(), sum(mine(r) for r in ranks))
g = funcol.all_gather_tensor(mine(rank).to(dev), 0, dist.group.WORLD)
torch.testing.assert_close(g.cpu(), torch.cat([mine(r) for r in ranks]))
a, b = mine(rank).to(dev), mine(rank, n=3).to(dev)
with dist._coalescing_manager(async_ops=False):
    dist.all_reduce(a)
    dist.all_reduce(b)
torch.testing.assert_close(b.cpu(), sum(mine(r, n=3) for r in ranks))

# host tensors on the same group take gloo directly (backend "tfl" for sim, gloo for cpu)
dist.barrier()
stats = torch_fl.fallback_stats()
if transport == "staged":
    assert stats.get("c10d::allreduce (staged)", 0) >= 10, stats
else:  # nothing of the device's went through host memory
    assert not any("(staged)" in k for k in stats), stats
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.runtime
@pytest.mark.timeout(420)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_collectives_match_cpu_reference(transport: str) -> None:
    # Bounds are generous for loaded CI machines; on an idle one this takes seconds.
    env = {**TRANSPORTS[transport], "EXPECT_TRANSPORT": transport}
    outs = assert_all_ok(launch(COLLECTIVES, env=env, timeout=400))
    assert all(o.strip().endswith("OK") for o in outs)


GROUPS = """
import tempfile
dist.init_process_group("cpu:gloo,sim:tfl", device_id=dev, timeout=datetime.timedelta(seconds=60))
assert dist.get_backend() == "cpu:gloo,sim:tfl", dist.get_backend()

objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
assert objs == [{"rank": r, "name": f"r{r}"} for r in range(world)], objs
box = [f"hello from {rank}"]
dist.broadcast_object_list(box, src=1)
assert box == ["hello from 1"], box

# new_group: a subgroup of one rank, and one of all ranks (its own backend)
solo = dist.new_group([0])
both = dist.new_group([0, 1])
if rank == 0:
    t = torch.ones(3, device=dev)
    dist.all_reduce(t, group=solo)
    assert t.cpu().tolist() == [1, 1, 1]
t = torch.full((3,), float(rank + 1), device=dev)
dist.all_reduce(t, group=both)
assert t.cpu().tolist() == [3, 3, 3]

# DeviceMesh on the device
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("sim", (world,))
t = torch.full((2,), float(rank), device=dev)
dist.all_reduce(t, group=mesh.get_group())
assert t.cpu().tolist() == [1.0, 1.0]

# mismatched shapes across ranks are reported on every rank, not a hang: by
# torch-fl's pre-check on the staged path (a ValueError before anything runs),
# by the plugin's transport on the native path (the communicator fails)
try:
    dist.all_reduce(torch.ones(3 + rank, device=dev))
    torch.accelerator.synchronize(dev)
except ValueError as e:
    assert "differs across ranks" in str(e) and "float32[3]" in str(e) and "float32[4]" in str(e), e
except (dist.DistBackendError, RuntimeError) as e:
    assert os.environ["TORCH_FL_DIST_STAGED"] == "0" and "mismatched collectives" in str(e), e
else:
    raise AssertionError("mismatched shapes not reported")

dist.destroy_process_group()
# the device is still usable, and a new group on it works
x = torch.arange(4.0, device=dev) * 2
assert x.cpu().tolist() == [0, 2, 4, 6]
dist.init_process_group("tfl", init_method=f"tcp://127.0.0.1:{os.environ['SECOND_PORT']}", rank=rank, world_size=world)
t, h = torch.ones(2, device=dev), torch.ones(2)
dist.all_reduce(t)
dist.all_reduce(h)
assert t.cpu().tolist() == [2, 2] and h.tolist() == [2, 2]
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_groups_objects_mesh_and_reinit(transport: str) -> None:
    assert_all_ok(launch(GROUPS, env={**TRANSPORTS[transport], "SECOND_PORT": str(free_port())}, timeout=150))


DEVICES = """
from torch_fl.distributed._backend import TorchFLBackend
assert torch.accelerator.current_device_index() == 0  # nobody called set_device
native = os.environ["TORCH_FL_DIST_STAGED"] == "0"
other = torch.device("sim", 1 - rank)

# device_id binds the group: its communicator is created on dev at once
dist.init_process_group(device_id=dev)
# the bound device becomes current (as DeviceMesh does for CUDA under torchrun)
assert torch.accelerator.current_device_index() == dev.index
backend = dist.group.WORLD._get_backend(dev)
assert isinstance(backend, TorchFLBackend)
assert list(backend.communicators) == ([dev.index] if native else []), backend.communicators
t = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(t)
assert t.cpu().tolist() == [3.0] * 4, t

# a collective on another device gets that device's communicator, on first use
t = torch.full((2,), float(rank + 1), device=other)
dist.all_reduce(t)
assert t.cpu().tolist() == [3.0, 3.0], t
assert list(backend.communicators) == ([dev.index, other.index] if native else []), backend.communicators

# tensors on two devices in one collective: a clear error on every rank, nothing sent
outs = [torch.empty(2, device=other) for _ in range(world)]
try:
    dist.all_gather(outs, torch.ones(2, device=dev))
except ValueError as e:
    assert "sim:0" in str(e) and "sim:1" in str(e) and "one device" in str(e), e
else:
    raise AssertionError("tensors on two devices were accepted")

# new_group and split_group follow the bound device; so does a DeviceMesh
sub = dist.new_group([0, 1])
t = torch.ones(3, device=dev)
dist.all_reduce(t, group=sub)
assert t.cpu().tolist() == [2.0] * 3
sub_backend = sub._get_backend(dev)
assert list(sub_backend.communicators) == ([dev.index] if native else []), sub_backend.communicators
halves = dist.split_group(split_ranks=[[0], [1]])
t = torch.full((2,), float(rank), device=dev)
dist.all_reduce(t, group=halves)
assert t.cpu().tolist() == [float(rank)] * 2, t
halves_backend = halves._get_backend(dev)
assert list(halves_backend.communicators) == ([dev.index] if native else []), halves_backend.communicators
pair = dist.split_group(split_ranks=[[0, 1]])
t = torch.full((2,), float(rank + 1), device=dev)
dist.all_reduce(t, group=pair)
assert t.cpu().tolist() == [3.0, 3.0], t
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("sim", (world,))
t = torch.full((2,), float(rank), device=dev)
dist.all_reduce(t, group=mesh.get_group())
assert t.cpu().tolist() == [1.0, 1.0], t
dist.destroy_process_group()

# without device_id: each collective uses its tensors' device, created on first use
dist.init_process_group("tfl", init_method=f"tcp://127.0.0.1:{os.environ['SECOND_PORT']}", rank=rank, world_size=world)
backend = dist.group.WORLD._get_backend(dev)
assert list(backend.communicators) == [], backend.communicators
t = torch.full((2,), float(rank + 1), device=dev)
dist.all_reduce(t)
assert t.cpu().tolist() == [3.0, 3.0], t
assert list(backend.communicators) == ([dev.index] if native else []), backend.communicators
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", [*TRANSPORTS, "native-nonblocking"])
def test_communicators_follow_devices(transport: str) -> None:
    # Rank 1 works on sim:1 and never calls set_device: the NCCL pattern.
    # Non-blocking communicators (NCCL's blocking=0) return before their
    # peers join; the collectives after them wait and give the same results.
    env = {**NATIVE, "TORCH_FL_DIST_NONBLOCKING": "1"} if transport == "native-nonblocking" else TRANSPORTS[transport]
    assert_all_ok(launch(DEVICES, env={**env, "SECOND_PORT": str(free_port())}, timeout=200))


LATE_COMMUNICATOR = """
import pathlib, time
done = pathlib.Path(os.environ["DONE_FILE"])
dist.init_process_group("tfl", timeout=datetime.timedelta(seconds=4))
if rank == 0:
    # The first collective on dev creates its communicator; rank 1 never
    # does, so joining fails after the group's timeout, which the backend
    # hands to the plugin (the simulator's own default is 300 s).
    try:
        dist.all_reduce(torch.ones(2, device=dev))
    except dist.DistBackendError as e:
        print(f"ERROR {e}")
    else:
        sys.exit("a communicator whose peer never joined was created")
    finally:
        done.write_text("done")
else:
    for _ in range(600):
        if done.exists():
            break
        time.sleep(0.1)
"""


@pytest.mark.timeout(120)
def test_group_timeout_bounds_communicator_creation(tmp_path) -> None:
    env = {**NATIVE, "DONE_FILE": str(tmp_path / "done")}
    out = assert_all_ok(launch(LATE_COMMUNICATOR, env=env, timeout=90))[0]
    assert "comm_init_rank_config failed" in out and "not every rank joined within 4 s" in out, out


KILLED = """
dist.init_process_group(device_id=dev, timeout=datetime.timedelta(seconds=20))
t = torch.ones(4, device=dev)
dist.all_reduce(t)
if rank == 1:
    os._exit(3)  # dies without a word
import time
start, error = time.monotonic(), None
for _ in range(400):
    try:
        dist.all_reduce(t)
        t.cpu()  # a host synchronization, like a training loop's loss.item()
    except torch.AcceleratorError as e:
        # native: the plugin's stream reports the failed collective at the
        # synchronization, as CUDA reports NCCL's; the backend's watchdog then
        # aborts the communicator, and the next collective says so
        print(f"stream error: {e}")
        time.sleep(0.05)
    except dist.DistBackendError as e:
        error = e
        break
if error is None:
    sys.exit("no DistBackendError from collectives with a dead peer")
took = time.monotonic() - start
print(f"ERROR after {took:.1f}s: {error}")
assert took < 60, took
# the device stays usable after abort
dist.destroy_process_group()
assert (torch.ones(2, device=dev) + 1).cpu().tolist() == [2, 2]
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_rank_raises_on_the_other(transport: str) -> None:
    rank0, rank1 = launch(KILLED, env=TRANSPORTS[transport], timeout=120)
    assert rank1.returncode == 3, rank1.stderr
    assert rank0.returncode == 0, rank0.stderr
    assert f"torch-fl (sim, {transport}): allreduce failed on rank 0 of 2" in rank0.stdout, rank0.stdout


@pytest.mark.timeout(120)
def test_rank_that_never_joins_times_out() -> None:
    body = """
    import time
    start = time.monotonic()
    try:
        dist.init_process_group(device_id=dev, timeout=datetime.timedelta(seconds=5))
    except Exception as e:  # torch's store (DistStoreError) or torch-fl's DistBackendError
        print(f"{type(e).__name__} after {time.monotonic() - start:.1f}s: {e}")
        sys.exit(0)
    sys.exit("joined a group whose other rank never started")
    """
    (rank0,) = launch(body, env=STAGED, timeout=90, ranks=[0])
    assert rank0.returncode == 0, rank0.stderr
    assert "Error after" in rank0.stdout and ("timed out" in rank0.stdout.lower() or "timeout" in rank0.stdout.lower())


def test_native_transport_needs_plugin_collectives() -> None:
    import torch_fl
    from torch_fl.distributed import _native_comm

    class NoCollectives:
        def has_collectives(self) -> bool:
            return False

    assert not _native_comm.available(NoCollectives())
    assert not _native_comm.available(object())
    plugin = next(iter(torch_fl._native.bound_plugins()))
    expected = hasattr(torch_fl._native, "Communicator") and bool(getattr(plugin, "has_collectives", bool)())
    assert _native_comm.available(plugin) == expected


@pytest.mark.timeout(60)
def test_backend_registered_for_device() -> None:
    import torch.distributed as dist

    assert dist.Backend.default_device_backend_map["sim"] == "tfl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert dist.Backend.backend_capability["tfl"] == ["sim", "cpu"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("script", ["ddp_train.py", "fsdp2_train.py"])
def test_training_matches_one_process(script: str, transport: str) -> None:
    """The examples check themselves: parameters equal across ranks and to one process on the full batch."""
    path = ROOT / "examples" / "distributed" / script
    body = f"""
    sys.argv = [{str(path)!r}, "--device", "sim", "--steps", "3", "--check"]
    exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {{"__name__": "__main__"}})
    """
    outs = assert_all_ok(launch(body, env=TRANSPORTS[transport], timeout=200))
    assert "parameters match one process" in outs[0], outs[0]


DDP_TIMES = """
dist.init_process_group(device_id=dev)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    ddp(torch.randn(8, 64, device=dev)).sum().backward()
    opt.step()
data = ddp._get_ddp_logging_data()
for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
    assert data.get(key, 0) > 0, (key, data)
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.timeout(180)
def test_ddp_collects_its_timings_on_the_device() -> None:
    # The reducer's per-device Timer (cpp_shim/src/observe/reducer_timer.cpp): without
    # one, DDP warns that time stats are only collected for CPU and CUDA.
    results = launch(DDP_TIMES, env=NATIVE, timeout=150)
    assert_all_ok(results)
    for r in results:
        assert "Time stats are currently only collected" not in r.stderr, r.stderr


@pytest.mark.timeout(240)
def test_torchrun_example() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(port), str(ROOT / "examples" / "distributed" / "ddp_train.py")]
    cmd += ["--device", "sim", "--steps", "2", "--compile"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False, env=_env())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "step 1" in result.stdout, result.stdout


def _env() -> dict[str, str]:
    import os

    return {**os.environ, **NATIVE}

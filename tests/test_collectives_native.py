"""The plugin's collectives (ABI 1.3) through ``_native.Communicator``.

Two ranks, each a separate Python process with its own simulated device,
talk over loopback TCP. Rank 0 creates the unique id and hands it to rank 1
through a file (standing in for torch.distributed's rendezvous store). Every
child runs under a timeout and is killed if it outlives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torch_fl import _native

from .conftest import HANDLE

pytestmark = pytest.mark.runtime

TIMEOUT = 240

RANK = """
import json, os, sys, time
from pathlib import Path
import torch, torch_fl
from torch_fl import _native

DEVICE = "sim"
handle = torch_fl.register_device_plugin(name=DEVICE)
rank, store = int(sys.argv[1]), Path(sys.argv[2])
plugin = handle.plugin
if rank == 0:
    tmp = store.with_suffix(".tmp")
    tmp.write_bytes(plugin.collectives_unique_id())
    tmp.rename(store)
else:
    while not store.exists():
        time.sleep(0.01)
comm = _native.Communicator(plugin, store.read_bytes(), 2, rank, 0)
stream = _native.current_stream_handle(0)
F32, I64, BF16 = (_native.DTYPES[n] for n in ("float32", "int64", "bfloat16"))
SUM, MAX = _native.REDUCE_OPS["SUM"], _native.REDUCE_OPS["MAX"]
"""

COLLECTIVES = """
out = {}
x = (torch.arange(6, dtype=torch.float32) + 10 * rank).to(DEVICE)
comm.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), F32, SUM, stream)
out["all_reduce"] = x.cpu().tolist()
m = torch.tensor([rank + 1, -rank], dtype=torch.int64).to(DEVICE)
comm.all_reduce(m.data_ptr(), m.data_ptr(), 2, I64, MAX, 0)
out["all_reduce_max"] = m.cpu().tolist()
b = (torch.full((4,), float(rank + 1), dtype=torch.bfloat16)).to(DEVICE)
comm.broadcast(b.data_ptr(), b.data_ptr(), 4, BF16, 1, stream)
out["broadcast"] = b.float().cpu().tolist()
s = torch.tensor([rank, rank + 0.5]).to(DEVICE)
g = torch.zeros(4).to(DEVICE)
comm.all_gather(s.data_ptr(), g.data_ptr(), 2, F32, stream)
out["all_gather"] = g.cpu().tolist()
out["async_error"] = comm.async_error()
comm.destroy()
print(json.dumps(out))
"""

DIES = """
if rank == 1:
    os._exit(0)  # a rank that dies after joining
x = torch.ones(8).to(DEVICE)
try:
    # queued, the failure shows at the synchronization (the simulator's sync
    # mode runs it inline: then the call itself raises)
    comm.all_reduce(x.data_ptr(), x.data_ptr(), 8, F32, SUM, stream)
    torch.sim.synchronize()
    print(json.dumps({"raised": None}))
except Exception as e:
    print(json.dumps({"raised": type(e).__name__, "message": str(e), "async": comm.async_error()}))
comm.abort()
comm.destroy()
y = (torch.ones(2).to(DEVICE) * 3).cpu().tolist()  # the device stays usable
print(json.dumps({"after": y}))
"""


def run_ranks(tmp_path: Path, body: str) -> list[str]:
    """Runs RANK + ``body`` as ranks 0 and 1; returns each one's stdout."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK) + textwrap.dedent(body))
    env = {**os.environ, "TORCH_FL_SIM_COLL_TIMEOUT": "60"}
    store = tmp_path / "unique_id"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(store)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, f"rank exited {p.returncode}\n{stdout}\n{stderr}"
            outputs.append(stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outputs


def test_the_simulator_offers_collectives() -> None:
    assert HANDLE.plugin.has_collectives()
    uid = HANDLE.plugin.collectives_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    stream = _native.current_stream_handle(0)
    assert stream != 0
    with torch.sim.stream(torch.sim.Stream()):
        assert _native.current_stream_handle(0) != stream
    with pytest.raises(ValueError, match="128 bytes"):
        _native.Communicator(HANDLE.plugin, b"short", 2, 0, 0)


def test_dtypes_and_reduce_ops_cross_as_the_abi_codes() -> None:
    import torch.distributed as dist

    from torch_fl.distributed import _codes

    # TFL_DType {code FLOAT = 2, bits 32, lanes 1}, packed in memory order.
    assert _codes.dtype_code(torch.float32) == _native.DTYPES["float32"] == 2 | 32 << 8 | 1 << 16
    assert _codes.DTYPE_NAMES[_codes.dtype_code(torch.bfloat16)] == "bfloat16"
    ops = {
        name: _codes.reduce_op_code(getattr(dist.ReduceOp, name)) for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
    }
    assert ops == {"SUM": 0, "PRODUCT": 1, "MIN": 2, "MAX": 3, "AVG": 4} == _native.REDUCE_OPS
    with pytest.raises(TypeError, match=r"float8_e4m3fn.*cannot describe it"):
        _codes.dtype_code(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"BAND.*SUM, PRODUCT, MIN, MAX or AVG"):
        _codes.reduce_op_code(dist.ReduceOp.BAND)


def test_all_reduce_broadcast_and_all_gather_across_two_processes(tmp_path: Path) -> None:
    results = [json.loads(out.strip().splitlines()[-1]) for out in run_ranks(tmp_path, COLLECTIVES)]
    ref = (torch.arange(6.0) * 2 + 10).tolist()
    for r in results:
        assert r["all_reduce"] == ref
        assert r["all_reduce_max"] == [2, 0]
        assert r["broadcast"] == [2.0] * 4
        assert r["all_gather"] == [0.0, 0.5, 1.0, 1.5]
        assert r["async_error"] is None


def test_a_rank_that_dies_is_an_error_on_the_other(tmp_path: Path) -> None:
    out = run_ranks(tmp_path, DIES)[0].strip().splitlines()
    failure, after = json.loads(out[-2]), json.loads(out[-1])
    # Queued work fails at the synchronization, as CUDA reports NCCL's
    # asynchronous failures; a call that ran inline raises the plugin's error.
    assert failure["raised"] in ("AcceleratorError", "PluginRuntimeError"), failure
    assert "closed its connection" in failure["message"], failure
    assert failure["async"] and "rank 0 with rank 1" in failure["async"], failure
    assert after["after"] == [3.0, 3.0]

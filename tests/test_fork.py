"""Fork safety: a child forked after the device was used raises instead of hanging.

The plugin's worker threads do not survive ``fork()``; before, a forked
child hung forever at its first copy or kernel. Now, as with CUDA, any
device use in such a child raises an error naming the device and the
remedy (the "spawn" or "forkserver" start method), while DataLoader workers
that only load CPU data keep working with fork.

Every scenario runs in a fresh interpreter (:func:`run_python`, with a
timeout), since this process has registered the device and its own forks
would all be bad forks. Inside a scenario, :data:`PRELUDE`'s ``in_child``
forks with a deadline: the child arms ``alarm()`` so that a hang kills it,
and the parent kills it when the deadline passes, so a regression fails
fast and leaves no process behind.
"""

from __future__ import annotations

import json

import pytest

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

TIMEOUT = 300  # per scenario, in seconds; children get a shorter deadline

PRELUDE = """
import ast, gc, json, os, select, signal, sys, time
import torch
import torch_fl

CHILD_DEADLINE = 90


def outcome(fn):
    # ["ok", repr(result)] or [exception class, is a RuntimeError, message].
    try:
        return ["ok", repr(fn())]
    except Exception as e:
        return [type(e).__name__, isinstance(e, RuntimeError), str(e)]


def in_child(fn, exit_normally=False):
    # Runs fn() in a forked child and returns what it returned (a literal).
    # The child reports through a pipe; it ends with os._exit, or with a
    # normal interpreter exit (finalizers, atexit) when exit_normally.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(CHILD_DEADLINE)  # a hang kills the child
        try:
            report = repr(("ok", fn()))
        except BaseException as e:
            report = repr(("raised", type(e).__name__ + ": " + str(e)))
        os.write(w, report.encode())
        os.close(w)
        if exit_normally:
            sys.exit(0)
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + CHILD_DEADLINE + 10
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(r, 65536) if ready else b""
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
    kind, value = ast.literal_eval(b"".join(chunks).decode())
    assert kind == "ok", value
    return value
"""


def run_scenario(body: str, **constants: object) -> dict:
    """Runs PRELUDE, ``DEVICE`` and ``constants`` as globals, then ``body``, in a fresh interpreter.

    Returns the JSON the scenario's last line printed.
    """
    values = "".join(f"{name} = {value!r}\n" for name, value in {"DEVICE": DEVICE, **constants}.items())
    out = assert_ok(run_python(PRELUDE + values + body, timeout=TIMEOUT))
    return json.loads(out.strip().splitlines()[-1])


def assert_refused(result: list, *, cls: str | None = None, device: str = DEVICE) -> None:
    """``result`` is an :func:`outcome` of a call refused for the fork, with the promised message."""
    assert result[0] != "ok", f"the call succeeded in a forked child: {result}"
    name, is_runtime_error, message = result
    assert is_runtime_error, f"{name} is not a RuntimeError: {message}"
    if cls is not None:
        assert name == cls, result
    assert "forked subprocess" in message, message
    assert "'spawn'" in message and "'forkserver'" in message, message
    assert f"'{device}'" in message, message  # the device (or the plugin the core names: 'sim' (...))


def results_of(result: dict, name: str) -> list:
    """``result[name]``, failing with the names present when it is missing."""
    assert name in result, f"{name} missing from {sorted(result)}"
    return result[name]


def test_inherited_device_tensors_raise_in_a_forked_child() -> None:
    result = run_scenario(
        """
torch_fl.register_device_plugin(name=DEVICE)
x = torch.arange(4.0).to(DEVICE)
y = x * 2  # a kernel: the plugin's streams and threads are running
model = torch.nn.Linear(4, 2).to(DEVICE)
torch.accelerator.synchronize()

def child():
    global y, model
    calls = {
        "kernel": lambda: x + 1,
        "copy to host": lambda: x.cpu(),
        "item": lambda: y.sum().item(),
        "in-place": lambda: x.add_(1),
        "module": lambda: model(x),
        "cpu fallback": lambda: torch.relu(x),
        "copy between device tensors": lambda: y.copy_(x),
    }
    results = {name: outcome(fn) for name, fn in calls.items()}
    results["metadata"] = outcome(lambda: (tuple(x.shape), str(x.device)))
    # Destructors run in the child: they leak instead of calling the plugin.
    del y, model
    gc.collect()
    return results

results = in_child(child)
# Exiting normally runs every finalizer in the child: it must not hang either.
results["normal exit"] = in_child(lambda: outcome(lambda: x.cpu()), exit_normally=True)
results["parent afterwards"] = (x + 1).cpu().tolist()
print(json.dumps(results))
"""
    )
    for name in (
        "kernel",
        "copy to host",
        "item",
        "in-place",
        "module",
        "cpu fallback",
        "copy between device tensors",
        "normal exit",
    ):
        assert_refused(results_of(result, name))
    assert result["kernel"][2].startswith(f"Cannot use the '{DEVICE}' device in a forked subprocess (operator add")
    assert result["metadata"] == ["ok", f"((4,), '{DEVICE}:0')"], "metadata needs no device"
    assert result["parent afterwards"] == [1.0, 2.0, 3.0, 4.0], "the parent's device is unaffected"


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
def test_a_forked_child_never_calls_the_plugin(fixture_plugin) -> None:
    # The fixture's fork trap aborts when its memory, copy, synchronize or
    # destroy entries run in a forked child: freeing inherited tensors and
    # events there must leak instead, through explicit deletes and the
    # interpreter's own exit.
    trap = fixture_plugin("fork_trap", "FIXTURE_FORK_TRAP")
    result = run_scenario(
        """
torch_fl.register_device_plugin(name="trapdev", plugin_path=TRAP)
x = torch.arange(4.0).to("trapdev")
y = x + x
event = torch.Event(device="trapdev")
event.record()
torch.accelerator.synchronize()

def child():
    global x, y, event
    results = {"kernel": outcome(lambda: x + 1), "copy": outcome(lambda: y.cpu())}
    del y, event
    gc.collect()
    return results

results = in_child(child, exit_normally=True)
results["parent"] = (x + y).cpu().tolist()
print(json.dumps(results))
""",
        TRAP=str(trap),
    )
    for name in ("kernel", "copy"):
        assert_refused(result[name], device="trapdev")
    assert result["parent"] == [0.0, 3.0, 6.0, 9.0]


def test_new_device_tensors_raise_in_a_forked_child() -> None:
    result = run_scenario(
        """
torch_fl.register_device_plugin(name=DEVICE)
torch.ones(1).to(DEVICE)

def child():
    calls = {
        "empty": lambda: torch.empty(3, device=DEVICE),
        "ones": lambda: torch.ones(3, device=DEVICE),
        "randn": lambda: torch.randn(3, device=DEVICE),
        "to": lambda: torch.ones(3).to(DEVICE),
        "Module.to": lambda: torch.nn.Linear(2, 2).to(DEVICE),
        "tensor": lambda: torch.tensor([1.0], device=DEVICE),
        "pin_memory": lambda: torch.ones(3).pin_memory(),
    }
    return {name: outcome(fn) for name, fn in calls.items()}

print(json.dumps(in_child(child)))
"""
    )
    for name in ("empty", "ones", "randn", "to", "Module.to", "tensor", "pin_memory"):
        assert_refused(results_of(result, name))
    # Python factories and .to() stop in torch.<name>._lazy_init, before dispatch.
    for name in ("empty", "to"):
        assert_refused(result[name], cls="BadForkError")


def test_bad_fork_state_and_registration() -> None:
    result = run_scenario(
        """
torch_fl.register_device_plugin(name=DEVICE)
mod = getattr(torch, DEVICE)
parent = {"bad fork": mod._is_in_bad_fork(), "initialized": mod.is_initialized()}
mod.init()  # a no-op after registration

def child():
    return {
        "bad fork": mod._is_in_bad_fork(),
        "initialized": mod.is_initialized(),
        "init": outcome(mod.init),
        "device_count": outcome(mod.device_count),
        "is_available": outcome(mod.is_available),
        "manual_seed": outcome(lambda: torch.manual_seed(7).initial_seed()),
        "CPU work": outcome(lambda: float(torch.ones(3).sum())),
        "register again": outcome(lambda: torch_fl.register_device_plugin(name=DEVICE)),
        "load a plugin": outcome(lambda: torch_fl._native.load_plugin(torch_fl._native.bound_runtime().path)),
        "Plugin.synchronize": outcome(lambda: torch_fl._native.bound_runtime().synchronize(0)),
        "Plugin.memory_stats": outcome(lambda: torch_fl._native.bound_runtime().memory_stats(0)),
    }

print(json.dumps({"parent": parent, "child": in_child(child)}))
"""
    )
    assert result["parent"] == {"bad fork": False, "initialized": True}
    child = result["child"]
    assert child["bad fork"] is True and child["initialized"] is False
    for name in ("init", "register again", "load a plugin", "Plugin.synchronize", "Plugin.memory_stats"):
        assert_refused(child[name], cls="BadForkError")
    # What never reaches the plugin keeps working, as with CUDA: counts, and
    # torch.manual_seed, which skips a device in a bad fork.
    assert child["device_count"][0] == "ok" and int(child["device_count"][1]) >= 1
    assert child["is_available"] == ["ok", "True"]
    assert child["manual_seed"] == ["ok", "7"]
    assert child["CPU work"] == ["ok", "3.0"]


def test_runtime_api_raises_in_a_forked_child() -> None:
    result = run_scenario(
        """
torch_fl.register_device_plugin(name=DEVICE)
mod = getattr(torch, DEVICE)
stream = torch.Stream(device=DEVICE)
event = torch.Event(device=DEVICE)
event.record(stream)
mod.synchronize()

def child():
    global stream, event
    calls = {
        "synchronize": mod.synchronize,
        "memory_allocated": mod.memory_allocated,
        "memory_stats": mod.memory_stats,
        "empty_cache": mod.empty_cache,
        "new stream": lambda: torch.Stream(device=DEVICE),
        "stream.synchronize": stream.synchronize,
        "stream.query": stream.query,
        "event.query": event.query,
        "event.synchronize": event.synchronize,
        "event.record": lambda: torch.Event(device=DEVICE).record(stream),
        "set_device": lambda: mod.set_device(0),
        "device context": lambda: mod.device(0).__enter__(),
        "manual_seed_all": lambda: mod.manual_seed_all(1),
        "get_rng_state": mod.get_rng_state,
        "generator": lambda: torch.Generator(device=DEVICE),
    }
    results = {name: outcome(fn) for name, fn in calls.items()}
    # PyTorch documents torch.accelerator.synchronize as a no-op for an
    # accelerator it has not initialized, which a forked child's is (CUDA's too).
    results["accelerator.synchronize"] = outcome(lambda: torch.accelerator.synchronize(0))
    del stream, event  # destroying the event leaks rather than calling the plugin
    gc.collect()
    return results

print(json.dumps(in_child(child)))
"""
    )
    assert result.pop("accelerator.synchronize") == ["ok", "None"]
    assert len(result) == 15
    for outcome in result.values():
        assert_refused(outcome)


# A spawned child starts a fresh interpreter and cannot unpickle functions of
# a `python -c` script, so it runs this code through the builtin exec.
SPAWNED = """
import torch, torch_fl
torch_fl.register_device_plugin(name=DEVICE)
queue.put(["ok", (torch.arange(3.0).to(DEVICE) * 2).cpu().tolist(), getattr(torch, DEVICE)._is_in_bad_fork()])
"""


def test_multiprocessing_fork_raises_and_spawn_works() -> None:
    result = run_scenario(
        """
import multiprocessing as mp
torch_fl.register_device_plugin(name=DEVICE)
x = torch.ones(2).to(DEVICE) + 1

def use_device(queue):
    try:
        queue.put(["ok", (torch.ones(2).to(DEVICE) + x).cpu().tolist()])
    except Exception as e:
        queue.put([type(e).__name__, isinstance(e, RuntimeError), str(e)])

def run(method, target, args):
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    if method == "spawn":
        args = (args[0], {"queue": queue, "DEVICE": DEVICE})
    else:
        args = (*args, queue)
    p = ctx.Process(target=target, args=args)
    p.start()
    try:
        return queue.get(timeout=240)
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()

print(json.dumps({
    "fork": run("fork", use_device, ()),
    "spawn": run("spawn", exec, (SPAWNED,)),
    "parent afterwards": (x * 2).cpu().tolist(),
}))
""",
        SPAWNED=SPAWNED,
    )
    assert_refused(result["fork"])
    assert result["spawn"] == ["ok", [0.0, 2.0, 4.0], False], "a spawned child registers and uses the device"
    assert result["parent afterwards"] == [4.0, 4.0]


def test_a_fork_before_any_device_use_can_use_the_device() -> None:
    result = run_scenario(
        """
# torch_fl is imported (the shim is loaded) but no plugin is initialized.
def child():
    torch_fl.register_device_plugin(name=DEVICE)
    mod = getattr(torch, DEVICE)
    model = torch.nn.Linear(3, 1).to(DEVICE)
    model(torch.ones(2, 3).to(DEVICE)).sum().backward()
    return {
        "bad fork": mod._is_in_bad_fork(),
        "initialized": mod.is_initialized(),
        "result": (torch.arange(3.0).to(DEVICE) * 2).cpu().tolist(),
        "grad on device": model.weight.grad.device.type == DEVICE,
    }

child_result = in_child(child)
torch_fl.register_device_plugin(name=DEVICE)
print(json.dumps({"child": child_result, "parent": (torch.arange(3.0).to(DEVICE) + 1).cpu().tolist()}))
"""
    )
    assert result["child"] == {
        "bad fork": False,
        "initialized": True,
        "result": [0.0, 2.0, 4.0],
        "grad on device": True,
    }
    assert result["parent"] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("pin_memory", [False, True], ids=["unpinned", "pinned"])
def test_dataloader_fork_workers_feed_a_device_model(pin_memory: bool) -> None:
    result = run_scenario(
        """
import copy
torch_fl.register_device_plugin(name=DEVICE)
mod = getattr(torch, DEVICE)
torch.manual_seed(0)
reference = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
model = copy.deepcopy(reference).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        # Runs in a forked worker: the device must read as unusable there.
        if not mod._is_in_bad_fork() or mod.is_initialized():
            raise AssertionError("a DataLoader worker is not marked as a bad fork")
        return torch.randn(5), torch.tensor([float(i)])


def seed_worker(worker_id):
    torch.manual_seed(1000 + worker_id)  # must skip the device, not raise


loader = torch.utils.data.DataLoader(
    Data(), batch_size=4, num_workers=2, multiprocessing_context="fork", pin_memory=PIN,
    worker_init_fn=seed_worker, timeout=120,
)
losses, pinned = [], []
for inputs, targets in loader:
    pinned.append(inputs.is_pinned() and targets.is_pinned())
    out = model(inputs.to(DEVICE, non_blocking=PIN))
    loss = torch.nn.functional.mse_loss(out, targets.to(DEVICE, non_blocking=PIN))
    opt.zero_grad()
    loss.backward()
    opt.step()
    ref_loss = torch.nn.functional.mse_loss(reference(inputs), targets)
    ref_opt.zero_grad()
    ref_loss.backward()
    ref_opt.step()
    losses.append([loss.item(), ref_loss.item()])
print(json.dumps({"losses": losses, "pinned": pinned}))
""",
        PIN=pin_memory,
    )
    assert len(result["losses"]) == 8, "every batch arrived"
    assert result["pinned"] == [pin_memory] * 8
    for device_loss, cpu_loss in result["losses"]:
        assert device_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)

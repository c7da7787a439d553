"""Where ``python -m torch_fl bench`` measures each device: this process, or a child process per device.

PyTorch has one custom-device slot (PrivateUse1) per process, so a process
holds one torch-fl device. The bench measures ``cpu`` and at most one
torch-fl device in its own process (the one already registered, or the only
one asked for); every other torch-fl device runs in a child process: the same
command with ``--devices <device> --json`` and the same options, bounded by a
timeout, killed when it runs over. The child's JSON report is read back and
merged by :mod:`torch_fl.bench`; a child that exits non-zero, prints no
report or times out leaves an ``{"error": ...}`` with the tail of its stderr
in its device's cells instead. Children run one at a time, never beside a
measurement, so that they do not compete for the host's cores.

How a process registers a device: ``--plugin NAME=PATH`` first (the library
at PATH), then ``sim`` is the bundled simulator, and any other name is found
by :func:`torch_fl.register_device_plugin`'s discovery
(``TORCH_FL_PLUGIN_PATH``, installed plugin packages). :func:`check_device`
refuses a name discovery cannot find before anything is timed, without
initializing any plugin.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChildResult",
    "check_device",
    "child_command",
    "measure_in_child",
    "parse_plugins",
    "plan_devices",
    "run_child",
]

#: Lines of a child's stderr kept for its error cells.
STDERR_TAIL_LINES = 15
#: Default seconds a child may run: ``(full, --quick)``.
DEFAULT_TIMEOUT_S = (1800.0, 300.0)
#: The exit code of a usage error (also the child's, for an unknown device).
EXIT_USAGE = 2


def parse_plugins(values: Sequence[str] | None) -> dict[str, str]:
    """``--plugin NAME=PATH`` options as ``{NAME: PATH}``.

    Raises:
        ValueError: a value without ``=``, an empty name or path, or one name twice.
    """
    plugins: dict[str, str] = {}
    for value in values or ():
        name, sep, path = value.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"--plugin takes NAME=PATH (e.g. ocl=target/release/libtorchfl_opencl.so), not {value!r}")
        if name in plugins and plugins[name] != path:
            raise ValueError(f"--plugin names {name!r} twice ({plugins[name]!r} and {path!r})")
        plugins[name] = path
    return plugins


def _discoverable(name: str) -> bool:
    """Whether discovery would find a plugin for ``name``, without initializing one."""
    from . import _native, _paths, plugins

    if any(candidate == name for candidate, *_ in _paths.bundled_candidates()):
        return True
    if plugins.packaged_plugins(name):  # a broken package is found too: its child says what is wrong
        return True
    for path in _native.plugin_path_files():
        try:
            if _native.probe_plugin(path)["name"] == name:
                return True
        except Exception:  # not a plugin, or a broken one: discovery skips it too
            continue
    return False


def check_device(name: str, plugins: Mapping[str, str], registered: str | None) -> None:
    """Refuse ``name`` when no process could make it a device; nothing is initialized.

    ``cpu``, the torch-fl device of this process (``registered``), a name of
    ``--plugin`` and a name discovery finds are accepted.

    Raises:
        ValueError: the name is a PyTorch device type, or no plugin is found
            for it; the message says what to do.
    """
    if name == "cpu" or name == registered:
        return
    from . import _native
    from .errors import InvalidDeviceNameError

    try:
        _native.check_device_name(name)
    except InvalidDeviceNameError as err:
        raise ValueError(f"unknown device {name!r}: {err}") from None
    if name in plugins or _discoverable(name):
        return
    raise ValueError(
        f"unknown device {name!r}: no torch-fl plugin named {name!r} was found (searched TORCH_FL_PLUGIN_PATH, "
        f"installed plugin packages and the bundled simulator 'sim'). Install its plugin package, add its "
        f"library to TORCH_FL_PLUGIN_PATH, or pass --plugin {name}=PATH/TO/LIBRARY.so"
    )


def plan_devices(devices: Sequence[str], registered: str | None) -> tuple[str | None, list[str]]:
    """Which torch-fl device this process measures (or None) and which run in child processes.

    This process keeps its registered torch-fl device; with none registered it
    takes the only torch-fl device asked for. With several and none
    registered, every one runs in a child, so that each is measured the same
    way (and no plugin's threads run beside the others' measurements).
    """
    fl = [d for d in devices if d != "cpu"]
    if registered is not None:
        local = registered if registered in fl else None
    else:
        local = fl[0] if len(fl) == 1 else None
    return local, [d for d in fl if d != local]


def child_command(device: str, args: argparse.Namespace, plugin_path: str | None) -> list[str]:
    """The command that measures ``device`` alone in a child: this bench, ``--json``, the same options."""
    command = [sys.executable, "-m", "torch_fl", "bench", "--devices", device, "--json"]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.quick:
        command.append("--quick")
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    if plugin_path is not None:
        command += ["--plugin", f"{device}={plugin_path}"]
    return command


@dataclass
class ChildResult:
    """How a child process measuring one device ended.

    Attributes:
        device: the device it measured.
        returncode: its exit status; None when it was killed on timeout.
        report: its JSON report, or None when it printed none that parses.
        stderr_tail: the last lines of its stderr.
        seconds: its wall time.
        error: why its figures are missing or incomplete (None: it exited 0
            with a report).
    """

    device: str
    returncode: int | None
    report: dict[str, Any] | None
    stderr_tail: str
    seconds: float
    error: str | None = None


def run_child(
    command: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, progress: bool = True
) -> tuple[int | None, str, str, float]:
    """Run ``command`` with a timeout: (exit status or None when killed, stdout, stderr tail, seconds).

    The child's ``bench:`` progress lines go on to this process' stderr when
    ``progress``; it is killed when it outlives ``timeout`` seconds, or when
    this process is interrupted.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env
    )
    out: list[str] = []
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)

    def read_stdout() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            if progress and line.startswith("bench: "):
                print(line, end="", file=sys.stderr, flush=True)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for reader in readers:
        reader.start()
    returncode: int | None = None
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)  # a grandchild may hold the pipes open: give up on it
    if not any(reader.is_alive() for reader in readers):
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return returncode, "".join(out), "\n".join(tail), time.monotonic() - start


def _parse_report(stdout: str, device: str) -> dict[str, Any] | None:
    """The child's JSON report when it is one for ``device``; None otherwise."""
    text = stdout.strip()
    start = text.find("{")  # tolerate lines a plugin printed before the report
    try:
        report = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        return None
    if any(not isinstance(r, dict) or device not in r.get("devices", {}) for r in report["results"]):
        return None
    return report


def measure_in_child(
    device: str, args: argparse.Namespace, plugins: Mapping[str, str], progress: bool = True
) -> ChildResult:
    """Measure ``device`` in a child process (``args.timeout`` seconds at most) and read its report back."""
    command = child_command(device, args, plugins.get(device))
    # The child registers the device itself: an autoloaded one would take the slot first.
    env = {**os.environ, "TORCH_FL_AUTOLOAD": "0"}
    if progress:
        print(f"bench: {device} in a child process (timeout {args.timeout:g} s)", file=sys.stderr, flush=True)
    returncode, stdout, tail, seconds = run_child(command, args.timeout, env=env, progress=progress)
    report = _parse_report(stdout, device)
    result = ChildResult(device, returncode, report, tail, seconds)
    last = next((line for line in reversed(tail.splitlines()) if line.strip()), "no output on stderr")
    if returncode is None:
        result.error = f"the child process measuring {device!r} was killed after {args.timeout:g} s (--timeout)"
    elif returncode != 0:
        result.error = f"the child process measuring {device!r} exited with {returncode}: {last}"
    elif report is None:
        result.error = f"the child process measuring {device!r} printed no JSON report for it"
    return result

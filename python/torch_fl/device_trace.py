"""The device trace: what each operator did on the plugin device.

:func:`trace` records, over a ``with`` block, every call torch-fl makes
into the plugin for an operator and every CPU fallback: the plugin, the
kernel's symbol, the device and stream, the arguments' dtypes and shapes,
the host time of the call and, when the plugin can time events
(``TFL_CAP_EVENT_TIMING``), the device time of the work it queued, read from
a pair of plugin timing events around it. Copies between host and device
are recorded the same way, with their size::

    with torch_fl.trace("step.json") as t:
        loss = model(x).sum()
        loss.backward()
    print(t.summary())

The file is a Chrome trace (open it in https://ui.perfetto.dev or
``chrome://tracing``): one row per host thread with the calls as they were
made, one row per device stream with the work as it ran, and an arrow from
each call to its work. ``TORCH_FL_TRACE=path`` traces a whole run without
editing it: recording starts when the device is registered and the file is
written at exit (``{pid}`` and ``{rank}`` in the path are replaced, for
multi-process runs).

``torch.profiler`` shows the same device activity: with
``ProfilerActivity.PrivateUse1`` its tables and Chrome traces get the
plugin's kernels and copies as device events, linked to the operators that
launched them (cpp_shim/src/observe/kineto_profiler.cpp).

Not recorded: operators torch-fl implements itself without calling the
plugin (views, ``empty``, metadata changes), which queue no device work.
Tracing costs a few microseconds per call (two timing events and a lock),
only while a trace is active; at most a million calls are kept per trace
and later ones are counted in :attr:`DeviceTrace.dropped`.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from . import _C, _native

TraceKind = Literal["kernel", "copy", "fallback"]
_KINDS: tuple[TraceKind, ...] = ("kernel", "copy", "fallback")
_HOST_PID = 0
_DEVICE_PID_BASE = 1000


@functools.lru_cache(maxsize=4096)
def _kernel_symbol(op: str) -> str:
    try:
        return _native.kernel_symbol(op)
    except ValueError:
        return ""


@dataclass(frozen=True)
class TraceEvent:
    """One traced call: a plugin kernel, a copy, or a CPU fallback."""

    kind: TraceKind
    """``"kernel"``, ``"copy"`` or ``"fallback"``."""
    name: str
    """The operator (``"add.Tensor"``; ``"aten::cosh"`` for a fallback) or the copy (``"copy (host to device)"``)."""
    plugin: str
    """The label of the plugin that ran it; empty for a fallback."""
    inputs: str
    """The arguments' dtypes and shapes, and scalar values: ``"f32[64, 3], f32[3], 1"``."""
    device: int | None
    """The device index, or None."""
    stream: int | None
    """The stream: 0 is the device's default stream, then 1, 2... in order of first use in the trace; None for a
    synchronous copy or a fallback."""
    thread: int
    """The host thread: 1, 2... in order of each thread's first traced call."""
    bytes: int
    """Bytes moved, for a copy."""
    host_begin_ns: int
    """When the host call began (the host's real-time clock, nanoseconds, as torch.profiler uses)."""
    host_end_ns: int
    """When it returned."""
    device_begin_ns: int | None
    """When the queued work began on the device, on the host's clock; None when the plugin cannot time events."""
    device_end_ns: int | None
    """When it ended."""

    @property
    def kernel_symbol(self) -> str:
        """The kernel's exported symbol (``torch_fl_op_add_Tensor``), for a kernel; else empty."""
        return _kernel_symbol(self.name) if self.kind == "kernel" else ""

    @property
    def host_us(self) -> float:
        """Host time of the call, in microseconds."""
        return (self.host_end_ns - self.host_begin_ns) / 1e3

    @property
    def device_us(self) -> float | None:
        """Device time of the queued work, in microseconds; None when not measured."""
        if self.device_begin_ns is None or self.device_end_ns is None:
            return None
        return (self.device_end_ns - self.device_begin_ns) / 1e3


@dataclass
class DeviceTrace:
    """What :func:`trace` recorded; filled in when the block ends."""

    device_type: str = ""
    """The plugin device's name (``"sim"``)."""
    events: list[TraceEvent] = field(default_factory=list)
    """Every traced call, in the order the calls began."""
    dropped: int = 0
    """Calls not recorded because the trace was full."""

    def of_kind(self, kind: TraceKind) -> list[TraceEvent]:
        """The events of one kind."""
        return [e for e in self.events if e.kind == kind]

    def summary(self, top: int = 20) -> str:
        """A table of the operators and copies with the most device time (host time where not measured)."""
        rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for e in self.events:
            row = rows[(e.kind, e.name)]
            row[0] += 1
            row[1] += e.host_us
            row[2] += e.device_us or 0.0
        ordered = sorted(rows.items(), key=lambda kv: (kv[1][2], kv[1][1]), reverse=True)
        width = max([len(name) for (_, name), _ in ordered[:top]] + [9])
        lines = [f"{'operation':<{width}}  {'kind':<8}  {'calls':>6}  {'host us':>10}  {'device us':>10}"]
        for (kind, name), (calls, host, device) in ordered[:top]:
            lines.append(f"{name:<{width}}  {kind:<8}  {int(calls):>6}  {host:>10.1f}  {device:>10.1f}")
        if len(ordered) > top:
            lines.append(f"... {len(ordered) - top} more")
        plural = {"kernel": "kernels", "copy": "copies", "fallback": "CPU fallbacks"}
        counts = ", ".join(f"{len(self.of_kind(k))} {plural[k]}" for k in _KINDS)
        lines.append(f"{len(self.events)} calls ({counts}){f'; {self.dropped} dropped' if self.dropped else ''}")
        return "\n".join(lines)

    def to_chrome(self) -> dict[str, Any]:
        """The trace as a Chrome trace-event document (what :meth:`save` writes)."""
        return _chrome_document(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the Chrome trace to ``path`` and returns it."""
        target = Path(path)
        if target.parent != Path():
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_chrome()))
        return target


def _parse(document: str, device_type: str) -> DeviceTrace:
    data = json.loads(document)
    events = []
    for kind, name, plugin, inputs, device, stream, thread, _corr, nbytes, hb, he, db, de in data["records"]:
        events.append(
            TraceEvent(
                kind=_KINDS[kind],
                name=name,
                plugin=plugin,
                inputs=inputs,
                device=device if device >= 0 else None,
                stream=stream if stream >= 0 else None,
                thread=thread,
                bytes=nbytes,
                host_begin_ns=hb,
                host_end_ns=he,
                device_begin_ns=db if db >= 0 else None,
                device_end_ns=de if de >= 0 else None,
            )
        )
    return DeviceTrace(device_type=device_type, events=events, dropped=int(data["dropped"]))


def _chrome_document(t: DeviceTrace) -> dict[str, Any]:
    base = min(
        [e.host_begin_ns for e in t.events] + [e.device_begin_ns or e.host_begin_ns for e in t.events], default=0
    )

    def us(ns: int) -> float:
        return (ns - base) / 1e3

    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": _HOST_PID, "name": "process_name", "args": {"name": "host (torch-fl calls)"}},
        {"ph": "M", "pid": _HOST_PID, "name": "process_sort_index", "args": {"sort_index": 0}},
    ]
    threads: set[int] = set()
    streams: set[tuple[int, int]] = set()
    for flow, e in enumerate(t.events, start=1):
        args: dict[str, Any] = {"plugin": e.plugin, "inputs": e.inputs, "device": e.device, "stream": e.stream}
        if e.kind == "kernel":
            args["kernel_symbol"] = e.kernel_symbol
        if e.kind == "copy":
            args["bytes"] = e.bytes
        if e.device_us is not None:
            args["device_us"] = e.device_us
        threads.add(e.thread)
        out.append(
            {
                "ph": "X",
                "pid": _HOST_PID,
                "tid": e.thread,
                "ts": us(e.host_begin_ns),
                "dur": e.host_us,
                "name": e.name,
                "cat": e.kind,
                "args": args,
            }
        )
        if e.device_begin_ns is None or e.device is None or e.stream is None:
            continue
        pid = _DEVICE_PID_BASE + e.device
        streams.add((e.device, e.stream))
        device_args = {"plugin": e.plugin, "inputs": e.inputs, "host_us": e.host_us}
        if e.kind == "copy":
            device_args["bytes"] = e.bytes
        out.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": e.stream,
                "ts": us(e.device_begin_ns),
                "dur": e.device_us,
                "name": e.name,
                "cat": e.kind,
                "args": device_args,
            }
        )
        # An arrow from the call to the work it queued.
        common = {"name": "launch", "cat": "launch", "id": flow}
        out.append({"ph": "s", "pid": _HOST_PID, "tid": e.thread, "ts": us(e.host_begin_ns), **common})
        out.append({"ph": "f", "bp": "e", "pid": pid, "tid": e.stream, "ts": us(e.device_begin_ns), **common})
    for thread in sorted(threads):
        out.append(
            {"ph": "M", "pid": _HOST_PID, "tid": thread, "name": "thread_name", "args": {"name": f"thread {thread}"}}
        )
    for device in sorted({d for d, _ in streams}):
        pid = _DEVICE_PID_BASE + device
        out.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"{t.device_type}:{device}"}})
        out.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": 1 + device}})
    for device, stream in sorted(streams):
        label = "stream 0 (default)" if stream == 0 else f"stream {stream}"
        out.append(
            {"ph": "M", "pid": _DEVICE_PID_BASE + device, "tid": stream, "name": "thread_name", "args": {"name": label}}
        )
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"torch_fl_device": t.device_type, "base_time_ns": base, "dropped": t.dropped},
    }


def _device_type() -> str:
    return torch._C._get_privateuse1_backend_name()


@contextmanager
def trace(path: str | os.PathLike[str] | None = None) -> Iterator[DeviceTrace]:
    """Records the plugin device's calls over a ``with`` block.

    Traces may nest and may overlap a ``torch.profiler`` session: each sees
    the calls made while it is open. The block's end waits for the devices'
    queued work, to read its device times.

    Args:
        path: where to write the Chrome trace when the block ends; None
            writes nothing (use the yielded object).

    Yields:
        A :class:`DeviceTrace`, filled in when the block exits.
    """
    result = DeviceTrace(device_type=_device_type())
    start = _C.trace_begin()
    try:
        yield result
    finally:
        try:
            collected = _parse(_C.trace_collect(start), result.device_type)
        finally:
            _C.trace_end()
        result.events = collected.events
        result.dropped = collected.dropped
    if path is not None:
        result.save(path)


def _environment_path(template: str) -> Path:
    rank = os.environ.get("RANK", "0")
    return Path(template.replace("{pid}", str(os.getpid())).replace("{rank}", rank))


_environment_trace_started = False


def start_environment_trace() -> None:
    """Starts the trace ``TORCH_FL_TRACE`` asks for (once per process); the file is written at exit.

    Called when the device is registered.
    """
    global _environment_trace_started
    template = os.environ.get("TORCH_FL_TRACE", "")
    if not template or _environment_trace_started:
        return
    _environment_trace_started = True
    device_type = _device_type()
    start = _C.trace_begin()
    owner = os.getpid()

    def write() -> None:
        if os.getpid() != owner:
            return  # a forked child inherited the handler; the trace is its parent's
        try:
            collected = _parse(_C.trace_collect(start), device_type)
            target = collected.save(_environment_path(template))
            print(f"torch-fl: wrote the device trace of {len(collected.events)} calls to {target}", file=sys.stderr)
        finally:
            _C.trace_end()

    atexit.register(write)

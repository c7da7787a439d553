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

When the plugin reports its own activity records (ABI 1.8, the debugger's
view), each call also carries the records of what it made the plugin do
(:attr:`TraceEvent.native`): the vendor runtime's native calls
(``clEnqueueNDRangeKernel``), program builds and syncs on the host, and its
kernels, copies and fills with the device's own start and end times. A
call's device time is then the span of its device records instead of a
pair of timing events around it. :meth:`DeviceTrace.native_report` prints,
per operator, its native calls with counts and device times::

    with torch_fl.trace() as t:
        model(x)
    print(t.native_report())

The file is a Chrome trace (open it in https://ui.perfetto.dev or
``chrome://tracing``): one row per host thread with the calls as they were
made (each call's native host records nested under it), one row per device
stream with the work as it ran (the plugin's own kernels and copies when it
reports them), and an arrow from each call to its work.
``TORCH_FL_TRACE=path`` traces a whole run without editing it: recording
starts when the device is registered and the file is written at exit
(``{pid}`` and ``{rank}`` in the path are replaced, for multi-process runs);
``TORCH_FL_TRACE_REPORT=path`` writes :meth:`DeviceTrace.native_report`
beside it. ``python -m torch_fl trace -- python train.py`` does both and
prints the report (:mod:`torch_fl.trace_tool`).

``torch.profiler`` shows the same device activity: with
``ProfilerActivity.PrivateUse1`` its tables and Chrome traces get the
plugin's kernels and copies as device events, linked to the operators that
launched them (cpp_shim/src/observe/kineto_profiler.cpp).

Not recorded: operators torch-fl implements itself without calling the
plugin (views, ``empty``, metadata changes), which queue no device work.
Tracing costs a few microseconds per call (two timing events and a lock, or
the plugin's records), only while a trace is active; at most a million
calls are kept per trace and later ones are counted in
:attr:`DeviceTrace.dropped` (the plugin's records in
:attr:`DeviceTrace.native_dropped`). Benches: benches/README.md, "Tracing".
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from . import _C, _native

TraceKind = Literal["kernel", "copy", "fallback"]
_KINDS: tuple[TraceKind, ...] = ("kernel", "copy", "fallback")
NativeKind = Literal["api", "kernel", "copy", "memset", "sync", "build", "range", "mark"]
_DEVICE_WORK = frozenset({"kernel", "copy", "memset"})
_HOST_PID = 0
_DEVICE_PID_BASE = 1000
# The host row of plugin records no traced call caused (syncs, ranges).
_PLUGIN_TID = 1_000_000


@functools.lru_cache(maxsize=4096)
def _kernel_symbol(op: str) -> str:
    try:
        return _native.kernel_symbol(op)
    except ValueError:
        return ""


@dataclass(frozen=True)
class NativeRecord:
    """One record the plugin made of its own activity (ABI 1.8)."""

    kind: NativeKind
    """``"api"`` (a native runtime call), ``"build"``, ``"sync"``, ``"range"`` and ``"mark"`` happen on the host;
    ``"kernel"``, ``"copy"`` and ``"memset"`` are device work."""
    name: str
    """As the plugin names it: ``"clEnqueueNDRangeKernel"``, a kernel's name, a range's name."""
    detail: str
    """Sizes, bytes, the kernel an API call launched; may be empty."""
    device: int | None
    """The device, or None."""
    stream: int | None
    """The stream, numbered as :attr:`TraceEvent.stream`; None for host records."""
    call: int
    """The :attr:`TraceEvent.call` of the traced call that caused it; 0 for none (a sync, a range)."""
    begin_ns: int
    """Start on the host's clock (device times mapped through the plugin's clock pairs)."""
    end_ns: int
    """End on the host's clock."""
    host_clock: bool
    """Whether the plugin timed it on the host (else on the device's own clock)."""

    @property
    def us(self) -> float:
        """Its duration, in microseconds."""
        return (self.end_ns - self.begin_ns) / 1e3

    @property
    def device_work(self) -> bool:
        """Whether it is work the device ran (a kernel, copy or fill)."""
        return self.kind in _DEVICE_WORK


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
    call: int = 0
    """The id the plugin's records of this call carry (0 when the plugin reports no records)."""
    native: tuple[NativeRecord, ...] = ()
    """What the call made the plugin do, in time order; empty when the plugin reports no records."""

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
    native: list[NativeRecord] = field(default_factory=list)
    """Every record the plugin reported during the trace, those of no traced call included, in time order."""
    native_dropped: int = 0
    """The plugin's records lost to its bound or the trace's, or malformed."""

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

    def native_report(self, top: int = 20) -> str:
        """Per operator, most device time first: its calls, then what they made the plugin do.

        Each operator's native records are grouped by kind and name with their count and total time (device time
        for device work, host time for native calls), as a vendor profiler's API and GPU trace summaries show them.
        Records no traced call caused (host syncs, user ranges) come last.
        """
        if not self.native:
            return (
                f"{self.device_type or 'the device'}'s plugin reported no activity records "
                "(the optional ABI 1.8 get_activity); calls are timed with events:\n" + self.summary(top)
            )
        operators: dict[tuple[str, str], _ReportRow] = defaultdict(_ReportRow)
        for e in self.events:
            row = operators[(e.kind, e.name)]
            row.add(e.device_us or 0.0, e.native)
        caused = {e.call for e in self.events if e.call}
        unattributed = [r for r in self.native if r.call not in caused]
        ordered = sorted(operators.items(), key=lambda kv: kv[1].device_us, reverse=True)
        width = max([len(r.name) for r in self.native] + [8])
        lines: list[str] = []
        for (kind, name), row in ordered[:top]:
            lines.append(f"{name} ({kind}): {_plural(row.calls, 'call')}, device {row.device_us:.1f} us")
            lines.extend(row.native_lines(width))
        if len(ordered) > top:
            lines.append(f"... {len(ordered) - top} more operators")
        if unattributed:
            row = _ReportRow()
            row.add(0.0, unattributed)
            lines.append(f"(no traced call): {_plural(len(unattributed), 'record')}")
            lines.extend(row.native_lines(width))
        dropped = f"; {self.native_dropped} dropped" if self.native_dropped else ""
        lines.append(f"{len(self.events)} calls, {len(self.native)} plugin records{dropped}")
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


@dataclass
class _ReportRow:
    """One operator's line of :meth:`DeviceTrace.native_report`, and its native records by kind and name."""

    calls: int = 0
    device_us: float = 0.0
    native: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))

    def add(self, device_us: float, records: Iterable[NativeRecord]) -> None:
        self.calls += 1
        self.device_us += device_us
        for r in records:
            entry = self.native[(r.kind, r.name)]
            entry[0] += 1
            entry[1] += r.us

    def native_lines(self, width: int) -> list[str]:
        lines = []
        for (kind, name), (count, us) in sorted(self.native.items(), key=lambda kv: kv[1][1], reverse=True):
            clock = "device" if kind in _DEVICE_WORK else "host"
            lines.append(f"    {kind:<7} {name:<{width}}  {int(count):>6} x  {clock:>6} {us:>10.1f} us")
        return lines


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _parse(document: str, device_type: str) -> DeviceTrace:
    data = json.loads(document)
    native = [
        NativeRecord(
            kind=kind,
            name=name,
            detail=detail,
            device=device if device >= 0 else None,
            stream=stream if stream >= 0 else None,
            call=call,
            begin_ns=begin,
            end_ns=end,
            host_clock=host_clock,
        )
        for kind, name, detail, device, stream, call, begin, end, host_clock in data.get("native", [])
    ]
    native.sort(key=lambda r: r.begin_ns)
    by_call: dict[int, list[NativeRecord]] = defaultdict(list)
    for record in native:
        if record.call:
            by_call[record.call].append(record)
    events = []
    for kind, name, plugin, inputs, device, stream, thread, _corr, nbytes, hb, he, db, de, call in data["records"]:
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
                call=call,
                native=tuple(by_call.get(call, ())) if call else (),
            )
        )
    return DeviceTrace(
        device_type=device_type,
        events=events,
        dropped=int(data["dropped"]),
        native=native,
        native_dropped=int(data.get("native_dropped", 0)),
    )


class _ChromeWriter:
    """Builds the Chrome trace-event document of a :class:`DeviceTrace` (see the module docs for its rows)."""

    def __init__(self, t: DeviceTrace) -> None:
        self.trace = t
        self.base = min(
            [e.host_begin_ns for e in t.events]
            + [e.device_begin_ns or e.host_begin_ns for e in t.events]
            + [r.begin_ns for r in t.native],
            default=0,
        )
        self.out: list[dict[str, Any]] = [
            {"ph": "M", "pid": _HOST_PID, "name": "process_name", "args": {"name": "host (torch-fl calls)"}},
            {"ph": "M", "pid": _HOST_PID, "name": "process_sort_index", "args": {"sort_index": 0}},
        ]
        self.threads: set[int] = set()
        self.streams: set[tuple[int, int]] = set()
        self.flows = 0

    def us(self, ns: int) -> float:
        return (ns - self.base) / 1e3

    def slice(self, pid: int, tid: int, begin_ns: int, end_ns: int, name: str, cat: str, args: dict[str, Any]) -> None:
        self.out.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": self.us(begin_ns),
                "dur": (end_ns - begin_ns) / 1e3,
                "name": name,
                "cat": cat,
                "args": args,
            }
        )

    def arrow(self, thread: int, begin_ns: int, device: int, stream: int, work_ns: int) -> None:
        """An arrow from a call to the work it queued."""
        self.flows += 1
        common = {"name": "launch", "cat": "launch", "id": self.flows}
        self.out.append({"ph": "s", "pid": _HOST_PID, "tid": thread, "ts": self.us(begin_ns), **common})
        pid = _DEVICE_PID_BASE + device
        self.out.append({"ph": "f", "bp": "e", "pid": pid, "tid": stream, "ts": self.us(work_ns), **common})

    def native(self, r: NativeRecord, thread: int, operator: str | None) -> None:
        """A plugin record: device work on its stream's row, host records on the calling thread's row."""
        args: dict[str, Any] = {"detail": r.detail, "clock": "host" if r.host_clock else "device"}
        if operator is not None:
            args["operator"] = operator
        cat = f"native:{r.kind}"
        if r.device_work and r.device is not None and r.stream is not None:
            self.streams.add((r.device, r.stream))
            self.slice(_DEVICE_PID_BASE + r.device, r.stream, r.begin_ns, r.end_ns, r.name, cat, args)
        elif r.kind == "mark":
            self.out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "pid": _HOST_PID,
                    "tid": thread,
                    "ts": self.us(r.begin_ns),
                    "name": r.name,
                    "cat": cat,
                    "args": args,
                }
            )
        else:
            self.slice(_HOST_PID, thread, r.begin_ns, r.end_ns, r.name, cat, args)

    def event(self, e: TraceEvent) -> None:
        args: dict[str, Any] = {"plugin": e.plugin, "inputs": e.inputs, "device": e.device, "stream": e.stream}
        if e.kind == "kernel":
            args["kernel_symbol"] = e.kernel_symbol
        if e.kind == "copy":
            args["bytes"] = e.bytes
        if e.device_us is not None:
            args["device_us"] = e.device_us
        if e.call:
            args["call"] = e.call
        self.threads.add(e.thread)
        self.slice(_HOST_PID, e.thread, e.host_begin_ns, e.host_end_ns, e.name, e.kind, args)
        for r in e.native:
            self.native(r, e.thread, e.name)
        work = [r for r in e.native if r.device_work and r.device is not None and r.stream is not None]
        if work:
            first = work[0]
            assert first.device is not None and first.stream is not None
            self.arrow(e.thread, e.host_begin_ns, first.device, first.stream, first.begin_ns)
            return
        if e.device_begin_ns is None or e.device_end_ns is None or e.device is None or e.stream is None:
            return
        self.streams.add((e.device, e.stream))
        device_args = {"plugin": e.plugin, "inputs": e.inputs, "host_us": e.host_us}
        if e.kind == "copy":
            device_args["bytes"] = e.bytes
        self.slice(
            _DEVICE_PID_BASE + e.device, e.stream, e.device_begin_ns, e.device_end_ns, e.name, e.kind, device_args
        )
        self.arrow(e.thread, e.host_begin_ns, e.device, e.stream, e.device_begin_ns)

    def document(self) -> dict[str, Any]:
        t = self.trace
        for e in t.events:
            self.event(e)
        caused = {e.call for e in t.events if e.call}
        unattributed = [r for r in t.native if r.call not in caused]
        for r in unattributed:
            self.native(r, _PLUGIN_TID, None)
        if any(not r.device_work for r in unattributed):
            self.out.append(
                {
                    "ph": "M",
                    "pid": _HOST_PID,
                    "tid": _PLUGIN_TID,
                    "name": "thread_name",
                    "args": {"name": "plugin (no traced call)"},
                }
            )
        for thread in sorted(self.threads):
            self.out.append(
                {
                    "ph": "M",
                    "pid": _HOST_PID,
                    "tid": thread,
                    "name": "thread_name",
                    "args": {"name": f"thread {thread}"},
                }
            )
        for device in sorted({d for d, _ in self.streams}):
            pid = _DEVICE_PID_BASE + device
            self.out.append(
                {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"{t.device_type}:{device}"}}
            )
            self.out.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": 1 + device}})
        for device, stream in sorted(self.streams):
            label = "stream 0 (default)" if stream == 0 else f"stream {stream}"
            self.out.append(
                {
                    "ph": "M",
                    "pid": _DEVICE_PID_BASE + device,
                    "tid": stream,
                    "name": "thread_name",
                    "args": {"name": label},
                }
            )
        return {
            "traceEvents": self.out,
            "displayTimeUnit": "ms",
            "otherData": {
                "torch_fl_device": t.device_type,
                "base_time_ns": self.base,
                "dropped": t.dropped,
                "native_dropped": t.native_dropped,
            },
        }


def _chrome_document(t: DeviceTrace) -> dict[str, Any]:
    return _ChromeWriter(t).document()


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
    token = _C.trace_begin()
    try:
        yield result
    finally:
        try:
            collected = _parse(_C.trace_collect(token), result.device_type)
        finally:
            _C.trace_end(token)
        result.events = collected.events
        result.dropped = collected.dropped
        result.native = collected.native
        result.native_dropped = collected.native_dropped
    if path is not None:
        result.save(path)


def _environment_path(template: str) -> Path:
    rank = os.environ.get("RANK", "0")
    return Path(template.replace("{pid}", str(os.getpid())).replace("{rank}", rank))


_environment_trace_started = False


def start_environment_trace() -> None:
    """Starts the trace ``TORCH_FL_TRACE`` or ``TORCH_FL_TRACE_REPORT`` asks for (once per process).

    The Chrome trace and the native report (:meth:`DeviceTrace.native_report`) are written at exit. Called when
    the device is registered.
    """
    global _environment_trace_started
    template = os.environ.get("TORCH_FL_TRACE", "")
    report_template = os.environ.get("TORCH_FL_TRACE_REPORT", "")
    if not (template or report_template) or _environment_trace_started:
        return
    _environment_trace_started = True
    device_type = _device_type()
    token = _C.trace_begin()
    owner = os.getpid()

    def write() -> None:
        if os.getpid() != owner:
            return  # a forked child inherited the handler; the trace is its parent's
        try:
            collected = _parse(_C.trace_collect(token), device_type)
            if template:
                target = collected.save(_environment_path(template))
                print(f"torch-fl: wrote the device trace of {len(collected.events)} calls to {target}", file=sys.stderr)
            if report_template:
                report = _environment_path(report_template)
                if report.parent != Path():
                    report.parent.mkdir(parents=True, exist_ok=True)
                report.write_text(collected.native_report() + "\n")
        finally:
            _C.trace_end(token)

    atexit.register(write)

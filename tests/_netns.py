"""Two "hosts" on one machine: network namespaces joined by a veth pair.

:func:`two_hosts` makes two network namespaces, each with ``lo`` up and one
end of a veth pair addressed 198.18.0.1/24 and 198.18.0.2/24 (RFC 2544's
benchmarking range; the addresses exist only inside the namespaces), and
always removes them: every process still inside is killed (``ip netns
pids``), then ``ip netns del``, on exceptions and KeyboardInterrupt too.
Processes run inside with :func:`spawn` (``ip netns exec``, their own
process group, output to files so nothing blocks on a full pipe), and end
with :func:`finish`, which turns a hang into a kill. Making namespaces
needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; :func:`skip_reason`
says what is missing.

Used by tests/test_multihost.py and benches/python/bench_hosts.py.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

#: The addresses of the two hosts (RFC 2544: reserved for benchmarking).
ADDRESSES = ("198.18.0.1", "198.18.0.2")
PREFIX_LEN = 24
_counter = itertools.count()


@dataclass(frozen=True)
class Host:
    """One namespace: its name (``ip netns``), its veth's name inside it, and its address."""

    netns: str
    ifname: str
    address: str


@dataclass
class Proc:
    """A process started by :func:`spawn`; stdout and stderr go to files read by :func:`finish`."""

    popen: subprocess.Popen[bytes]
    host: Host
    out: IO[bytes] = field(repr=False)
    err: IO[bytes] = field(repr=False)


@dataclass
class Result:
    """How a :class:`Proc` ended: ``returncode`` None when it was killed at the timeout."""

    returncode: int | None
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout:\n{self.stdout}\n--- stderr:\n{self.stderr}"


def _ip(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, check=False)


def _ip_ok(*args: str) -> None:
    result = _ip(*args)
    if result.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")


@functools.cache
def skip_reason() -> str | None:
    """Why two namespaces cannot be made here (None: they can); probes by making and removing them once."""
    need = (
        "two network namespaces joined by a veth pair (needs root, i.e. CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2)"
    )
    if not hasattr(os, "geteuid"):
        return f"{need}: not a POSIX system"
    if os.geteuid() != 0:
        return f"{need}: not running as root"
    if shutil.which("ip") is None:
        return f"{need}: no `ip` binary (install iproute2)"
    try:
        with two_hosts():
            pass
    except (OSError, subprocess.SubprocessError) as e:
        return f"{need}: {e} (an unprivileged container refuses `ip netns add`)"
    return None


def _sweep_stale() -> None:
    """Removes namespaces left by processes that no longer exist (one killed before its clean-up ran)."""
    listing = _ip("netns", "list")
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "tfl" or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(name)
        except PermissionError:
            pass


def _pids(netns: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", netns).stdout.split() if p.isdigit()]


def pids(host: Host) -> list[int]:
    """The processes still inside ``host`` (``ip netns pids``)."""
    return _pids(host.netns)


def _kill_inside(netns: str) -> None:
    """SIGKILLs every process in ``netns`` until none is left (bounded)."""
    for _ in range(50):
        pids = _pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove(netns: str) -> None:
    _kill_inside(netns)
    _ip("netns", "del", netns)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two namespaces joined by a veth pair, removed on exit with every process inside.

    Names are unique per process and call (``tfl-<pid>-<n>a``); the veth
    ends are created directly inside the namespaces, so nothing is added to
    the caller's namespace.
    """
    _sweep_stale()
    n = next(_counter)
    tag = f"{os.getpid()}-{n}"
    hosts = tuple(Host(f"tfl-{tag}{side}", f"tfl{side}{n}", addr) for side, addr in zip("ab", ADDRESSES))
    made: list[str] = []
    try:
        for host in hosts:
            _ip_ok("netns", "add", host.netns)
            made.append(host.netns)
        a, b = hosts
        _ip_ok("link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname, "netns", b.netns)
        for host in hosts:
            _ip_ok("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", host.ifname)
            _ip_ok("-n", host.netns, "link", "set", host.ifname, "up")
            _ip_ok("-n", host.netns, "link", "set", "lo", "up")
        yield a, b
    finally:
        # SIGINT during the clean-up would leave namespaces behind: blocked
        # there (and delivered afterwards).
        with _sigint_blocked():
            for name in made:
                _remove(name)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def set_link(host: Host, up: bool) -> None:
    """Takes ``host``'s veth end down (both ends lose carrier: packets stop) or up again."""
    _ip_ok("-n", host.netns, "link", "set", host.ifname, "up" if up else "down")


def spawn(host: Host, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> Proc:
    """Starts ``argv`` inside ``host`` (``ip netns exec``, which execs it) in its own process group."""
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    popen = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, *argv],
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
    )
    return Proc(popen, host, out, err)


def kill(proc: Proc) -> None:
    """SIGKILLs ``proc``'s process group (children that made their own sessions: see :func:`kill_host`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.popen.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.popen.kill()
    proc.popen.wait()


def kill_host(host: Host) -> None:
    """SIGKILLs every process inside ``host`` (torchrun's workers run in sessions of their own)."""
    _kill_inside(host.netns)


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text


def finish(procs: Sequence[Proc], timeout: float) -> list[Result]:
    """Waits for every process up to ``timeout`` seconds in all; kills what is left (and its host's processes)."""
    deadline = time.monotonic() + timeout
    timed_out: set[int] = set()
    try:
        for i, proc in enumerate(procs):
            try:
                proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                timed_out.add(i)
                kill(proc)
    finally:
        for i, proc in enumerate(procs):
            if proc.popen.poll() is None:
                timed_out.add(i)
                kill(proc)
        if timed_out:
            for host in {procs[i].host for i in timed_out}:
                kill_host(host)
    return [
        Result(None if i in timed_out else proc.popen.returncode, _read(proc.out), _read(proc.err))
        for i, proc in enumerate(procs)
    ]

"""Inductor's host kernels run in stream order: they wait for the current stream, once, and only for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torch_fl
import torch_fl.compiler

from .conftest import DEVICE, STRICT

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

needs_inductor = pytest.mark.skipif(
    STRICT, reason="strict mode: device memory is not host-addressable, Inductor is refused"
)


@pytest.fixture
def host_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the generated host kernels called (the generated code looks the hook up on each call)."""
    calls = [0]
    original = torch_fl.compiler.before_host_kernel

    def counting(name: str, index: int | None) -> None:
        calls[0] += 1
        original(name, index)

    monkeypatch.setattr(torch_fl.compiler, "before_host_kernel", counting)
    torch._dynamo.reset()
    yield calls
    torch._dynamo.reset()


def several_kernels(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Inductor's CPU code generator packs one graph's fusable nodes into one
    # kernel; graph breaks give one generated kernel per graph, with no ATen
    # call in between.
    a = (x * 2).sin()
    torch._dynamo.graph_break()
    b = (a + 1).cos()
    torch._dynamo.graph_break()
    return (b * b).sum(0), a.amax(1)


def host_kernel_waits() -> int:
    return torch_fl._C.sync_counts()["host_kernel_waits"]


@needs_inductor
def test_consecutive_host_kernels_wait_once(host_kernels: list[int]) -> None:
    compiled = torch.compile(several_kernels, backend="inductor")
    x = torch.randn(64, 32).to(DEVICE) * 3  # queued work the kernels read
    compiled(x)  # compiles
    x = x + 1
    torch_fl._C.reset_sync_counts()
    host_kernels[0] = 0
    out, col = compiled(x)
    assert host_kernels[0] == 3
    assert host_kernel_waits() == 1

    # Nothing queued on the stream since: the next call does not wait at all.
    compiled(x)
    assert host_kernels[0] == 6
    assert host_kernel_waits() == 1

    expected_out, expected_col = several_kernels(x)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(col, expected_col)


@needs_inductor
def test_other_streams_are_waited_for_only_when_the_user_orders_them(host_kernels: list[int]) -> None:
    compiled = torch.compile(lambda t: t * 2 + 1, backend="inductor")
    x = torch.arange(1 << 16, dtype=torch.float32).to(DEVICE)
    compiled(x)  # compiles, and waits for x's upload
    side = torch.Stream(device=DEVICE)
    side.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(side):
        y = x * 3  # on the side stream only

    torch_fl._C.reset_sync_counts()
    compiled(x)  # reads nothing the side stream writes
    assert host_kernel_waits() == 0

    torch.sim.current_stream().wait_stream(side)  # the user orders it, as on CUDA
    out = compiled(y)
    assert host_kernel_waits() == 1
    torch.testing.assert_close(out.cpu(), torch.arange(1 << 16, dtype=torch.float32) * 6 + 1)


@needs_inductor
def test_host_kernels_follow_the_current_stream(host_kernels: list[int]) -> None:
    compiled = torch.compile(lambda t: t.exp() - 1, backend="inductor")
    side = torch.Stream(device=DEVICE)
    x = torch.linspace(-2, 2, 4096).to(DEVICE)
    side.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(side):
        y = x * 0.5  # queued on the side stream
        torch_fl._C.reset_sync_counts()
        out = compiled(y)  # current stream: the side stream, which it waits for
        assert host_kernel_waits() == 1
    torch.sim.current_stream().wait_stream(side)
    torch.testing.assert_close(out.cpu(), (torch.linspace(-2, 2, 4096) * 0.5).exp() - 1)


def test_the_wait_names_a_bad_device() -> None:
    with pytest.raises(RuntimeError, match=r"Invalid device index 99 for device type 'sim'"):
        torch_fl._C.wait_current_stream_if_pending(99)
    torch.ones(4, device=DEVICE).add_(1)  # queued on the current stream of the current device
    assert torch_fl._C.wait_current_stream_if_pending(-1) is True
    assert torch_fl._C.wait_current_stream_if_pending(-1) is False

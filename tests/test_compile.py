"""torch.compile on the device: aot_eager everywhere, Inductor where the host can address device memory."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import DEVICE, STRICT

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def model_and_batch() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    return model, torch.randn(6, 8), torch.randint(0, 3, (6,))


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), [p.grad.detach().cpu() for p in model.parameters()]


def assert_compiled_step_matches_eager(backend: str) -> None:
    model, x, y = model_and_batch()
    eager = copy.deepcopy(model).to(DEVICE)
    compiled_model = copy.deepcopy(model).to(DEVICE)
    compiled = torch.compile(compiled_model, backend=backend)
    x, y = x.to(DEVICE), y.to(DEVICE)
    expected_loss, expected_grads = train_step(eager, x, y)
    loss, grads = train_step(compiled, x, y)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_aot_eager_training_step_matches_eager() -> None:
    torch._dynamo.reset()
    assert_compiled_step_matches_eager("aot_eager")


@pytest.mark.skipif(STRICT, reason="strict mode: device memory is not host-addressable, see the next test")
def test_inductor_training_step_matches_eager_on_host_addressable_memory() -> None:
    torch._dynamo.reset()
    assert_compiled_step_matches_eager("inductor")


@pytest.mark.skipif(not STRICT, reason="needs a plugin whose memory is not host-addressable (strict mode)")
def test_inductor_refuses_memory_the_host_cannot_address_before_any_step() -> None:
    torch._dynamo.reset()
    model, x, _ = model_and_batch()
    compiled = torch.compile(model.to(DEVICE))
    with pytest.raises(Exception, match=r"not addressable by the host\. Compile with backend='aot_eager'"):
        compiled(x.to(DEVICE))

"""``torch.compile(backend="torchfl_graphs")``: compiled models replayed as device graphs.

Each compiled step must equal eager execution, forward and backward, over
several calls (the first warms up, the next capture and replay); what a
graph cannot hold must run eagerly with a warning rather than fail.
"""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import DEVICE

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))


def test_compiled_training_steps_equal_eager_and_replay_device_graphs() -> None:
    eager = mlp().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="torchfl_graphs")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.1)
    for step in range(4):
        torch.manual_seed(step)
        x, y = torch.randn(6, 8).to(DEVICE), torch.randint(0, 3, (6,)).to(DEVICE)
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if model is eager:
                expected = loss.detach().cpu()
            else:
                torch.testing.assert_close(loss.detach().cpu(), expected, rtol=1e-5, atol=1e-6)
    for p, q in zip(compiled_model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-6)


def test_results_of_earlier_calls_stay_valid_after_later_replays() -> None:
    model = mlp().to(DEVICE).eval()
    compiled = torch.compile(model, backend="torchfl_graphs")
    inputs = [torch.randn(4, 8).to(DEVICE) for _ in range(4)]
    with torch.no_grad():
        outputs = [compiled(x) for x in inputs]
        for x, out in zip(inputs, outputs, strict=True):
            torch.testing.assert_close(out.cpu(), model(x).cpu())


def test_a_graph_that_cannot_be_captured_runs_eagerly_with_a_warning() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.erfinv(x.tanh()) * 2  # erfinv: no simulator kernel, a CPU fallback

    compiled = torch.compile(f, backend="torchfl_graphs")
    x = torch.randn(5).to(DEVICE)
    with pytest.warns(UserWarning, match="runs eagerly, without a device graph: .*aten::erfinv"):
        torch.testing.assert_close(compiled(x).cpu(), f(x).cpu())
    torch.testing.assert_close(compiled(x + 1).cpu(), f(x + 1).cpu())

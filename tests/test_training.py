"""Training unchanged on the device: agreement with the CPU, zero fallbacks, the seed script.

The models are small (ResNet-18 on 32x32 images, a two-layer transformer
encoder) so the suite stays quick; the operators they dispatch are the ones
larger images and deeper models dispatch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch

import torch_fl

from .conftest import DEVICE, NO_TORCHVISION, ROOT, assert_ok, run_python

torchvision = pytest.importorskip("torchvision", reason=NO_TORCHVISION)

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

BATCH, IMAGE, CLASSES = 8, 32, 10


@pytest.fixture
def no_fallbacks() -> Iterator[None]:
    """Fails the test if any operator fell back to the CPU while it ran."""
    torch_fl.reset_fallback_stats()
    yield
    stats = torch_fl.fallback_stats()
    assert stats == {}, f"operators fell back to the CPU: {stats}"


def resnet18() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=CLASSES)


class TextClassifier(torch.nn.Module):
    """Token embeddings, a transformer encoder, mean pooling and a linear head."""

    def __init__(self, vocab: int = 100, width: int = 32, classes: int = 5, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, 4, 64, dropout=dropout, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def images(seed: int = 1, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, IMAGE, IMAGE, generator=g), torch.randint(0, CLASSES, (batch,), generator=g)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters() if p.grad is not None}


def train_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    device: str,
) -> list[float]:
    criterion = torch.nn.CrossEntropyLoss().to(device)
    model.train()
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# -- agreement with the CPU -------------------------------------------------------


def test_resnet18_first_step_loss_and_gradients_match_the_cpu() -> None:
    cpu_model = resnet18()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    x, y = images()
    criterion = torch.nn.CrossEntropyLoss()

    cpu_loss = criterion(cpu_model(x), y)
    cpu_loss.backward()
    dev_loss = criterion.to(DEVICE)(dev_model(x.to(DEVICE)), y.to(DEVICE))
    dev_loss.backward()

    torch.testing.assert_close(dev_loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-5)
    expected, actual = grads(cpu_model), grads(dev_model)
    assert actual.keys() == expected.keys()
    for name, g in expected.items():
        torch.testing.assert_close(actual[name], g, rtol=1e-3, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    # Batch-norm running statistics were updated on the device as on the CPU.
    for (name, cpu_buf), dev_buf in zip(cpu_model.named_buffers(), dev_model.buffers(), strict=True):
        torch.testing.assert_close(dev_buf.cpu(), cpu_buf, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def sgd_losses(model: torch.nn.Module, device: str, batches: list, lr: float) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return train_steps(model, optimizer, batches, device)


def test_resnet18_losses_still_agree_after_several_steps_in_float64() -> None:
    # Training a small ResNet amplifies rounding differences: in float32,
    # two CPU runs that differ only in thread count drift apart by up to 1%
    # within five steps. In float64 the same noise stays far below the
    # tolerance, so this is where several steps can be compared tightly.
    cpu_model = resnet18().double()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    batches = [(x.double(), y) for x, y in (images(seed, batch=16) for seed in range(5))]
    cpu_losses = sgd_losses(cpu_model, "cpu", batches, lr=0.01)
    dev_losses = sgd_losses(dev_model, DEVICE, batches, lr=0.01)
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-10, atol=1e-12)


def test_resnet18_losses_agree_over_the_first_float32_steps() -> None:
    cpu_model = resnet18()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    batches = [images(seed, batch=16) for seed in range(3)]
    cpu_losses = sgd_losses(cpu_model, "cpu", batches, lr=0.001)
    dev_losses = sgd_losses(dev_model, DEVICE, batches, lr=0.001)
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-3, atol=1e-5)


def test_resnet18_evaluation_under_no_grad_matches_the_cpu(no_fallbacks) -> None:
    cpu_model = resnet18()
    train_steps(cpu_model, torch.optim.SGD(cpu_model.parameters(), lr=0.01), [images()], "cpu")
    dev_model = copy.deepcopy(cpu_model).to(DEVICE).eval()
    cpu_model.eval()
    x, y = images(seed=7)
    with torch.no_grad():
        expected = cpu_model(x)
        logits = dev_model(x.to(DEVICE))
        correct = logits.argmax(dim=1).eq(y.to(DEVICE)).sum().item()
    torch.testing.assert_close(logits.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert correct == expected.argmax(dim=1).eq(y).sum().item()


# -- zero fallbacks ---------------------------------------------------------------

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_resnet18_trains_with_no_fallbacks(optimizer: str, no_fallbacks) -> None:
    model = resnet18().to(DEVICE)
    losses = train_steps(model, OPTIMIZERS[optimizer](model.parameters()), [images(s) for s in range(3)], DEVICE)
    assert all(torch.isfinite(torch.tensor(losses))), losses


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_optimizer_steps_match_the_cpu(optimizer: str) -> None:
    # float64: in float32 an Adam update of a parameter whose gradient is
    # near zero amplifies rounding differences into visible ones.
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    batches = [(torch.randn(6, 8, dtype=torch.float64), torch.randint(0, 3, (6,))) for _ in range(3)]
    train_steps(cpu_model, OPTIMIZERS[optimizer](cpu_model.parameters()), batches, "cpu")
    train_steps(dev_model, OPTIMIZERS[optimizer](dev_model.parameters()), batches, DEVICE)
    for (name, expected), actual in zip(cpu_model.state_dict().items(), dev_model.state_dict().values(), strict=True):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_transformer_encoder_trains_with_no_fallbacks(no_fallbacks) -> None:
    torch.manual_seed(0)
    model = TextClassifier().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 100, (4, 12))
    labels = torch.randint(0, 5, (4,))
    losses = train_steps(model, optimizer, [(tokens, labels)] * 3, DEVICE)
    assert all(torch.isfinite(torch.tensor(losses))), losses


def test_transformer_encoder_matches_the_cpu_without_dropout() -> None:
    torch.manual_seed(0)
    cpu_model = TextClassifier(dropout=0.0)
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    tokens = torch.randint(0, 100, (4, 12))
    labels = torch.randint(0, 5, (4,))
    batches = [(tokens, labels)] * 3
    cpu_losses = train_steps(cpu_model, torch.optim.AdamW(cpu_model.parameters(), lr=1e-3), batches, "cpu")
    dev_losses = train_steps(dev_model, torch.optim.AdamW(dev_model.parameters(), lr=1e-3), batches, DEVICE)
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)


# -- the seed's script and the demo ---------------------------------------------------


def test_the_seed_script_trains_with_only_the_device_string_changed() -> None:
    result = run_python(
        f"""
        import runpy, sys
        sys.argv = ["train_resnet_seed.py", "--device", "{DEVICE}", "--steps", "2", "--image-size", "32"]
        runpy.run_path({str(ROOT / "examples" / "train_resnet_seed.py")!r}, run_name="__main__")
        """
    )
    out = assert_ok(result)
    assert [line.split(":")[0] for line in out.splitlines()] == ["step 0", "step 1"], out


def test_the_seed_spelling_pretrained_false_still_builds_the_model() -> None:
    with pytest.warns(UserWarning, match="deprecated since 0.13"):
        model = torchvision.models.resnet18(pretrained=False, num_classes=CLASSES)
    model = model.to(DEVICE)
    assert next(model.parameters()).device.type == DEVICE


def test_the_demo_trains_and_reports_throughput_and_fallbacks() -> None:
    result = run_python(
        "import torch_fl.demo; torch_fl.demo.main("
        "['--steps', '3', '--cpu-steps', '2', '--batch-size', '4', '--image-size', '32'])"
    )
    out = assert_ok(result)
    assert "throughput: sim" in out and "img/s" in out, out
    assert "fallback operators: 0 (0 calls)" in out, out
    assert "[" in result.stderr and "img/s" in result.stderr, "the progress bar goes to stderr"


def test_fallback_log_reports_at_exit() -> None:
    result = run_python(
        """
        import warnings, torch, torch_fl
        warnings.simplefilter("ignore")
        torch_fl.register_device_plugin(name="sim")
        x = torch.ones(3, device="sim")
        torch.cosh(x); torch.cosh(x); torch.lgamma(x)
        """,
        env={"TORCH_FL_LOG": "fallback"},
    )
    assert_ok(result)
    report = [line for line in result.stderr.splitlines() if line.startswith("[torch-fl]")]
    assert report[0] == "[torch-fl] CPU fallback: 3 calls of 2 operators", result.stderr
    assert report[1].split() == ["[torch-fl]", "2", "cosh.out"], report


def test_lstm_trains_on_the_device_and_matches_the_cpu(no_fallbacks) -> None:
    # PyTorch runs LSTMs on custom devices through a fused cell that has no
    # CPU kernel; torch-fl's composite (torch_fl/composites.py) serves it.
    torch.manual_seed(0)
    cpu_model = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    model = copy.deepcopy(cpu_model).to(DEVICE)
    x = torch.randn(3, 5, 8)
    results = []
    for m, inp in ((cpu_model, x), (model, x.to(DEVICE))):
        out, (h, c) = m(inp)
        (out.square().mean() + h.sum() + c.sum()).backward()
        results.append((out.detach().cpu(), grads(m)))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)

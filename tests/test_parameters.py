"""Parameters keep their identity when modules move to and from the device, as on CUDA.

On CUDA, ``model.to("cuda")`` assigns ``param.data`` and keeps every
``nn.Parameter`` object (``nn.Module._apply`` does so whenever
``torch._has_compatible_shallow_copy_type(param, moved)`` is true), so weights
tied between modules stay tied, optimizers created before the move train the
moved model, gradients, hooks, ``requires_grad`` and Parameter subclasses move
with their parameters. The shim gives the plugin device the same answer
(cpp_shim/src/dispatch/shallow_copy.cpp); these tests check every path that moves or
converts parameters against the CPU and against what CUDA does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from .conftest import DEVICE

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


# -- models ----------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(0.0))
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads)) + mask[:t, :t]
        y = (self.drop(att.softmax(dim=-1)) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style language model: the output projection is the token embedding."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, context: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        causal = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("mask", causal, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


class Tied(nn.Module):
    """Two layers sharing one weight, a frozen layer and a buffer: the small case."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.frozen = nn.Linear(4, 2)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.b(torch.tanh(self.a(x))) * self.scale)


class ScaledParameter(nn.Parameter):
    """A Parameter subclass, as libraries define for sharded or quantized weights."""


def tied(dtype: torch.dtype = torch.float64) -> Tied:
    torch.manual_seed(0)
    return Tied().to(dtype)


def sample(seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def objects(module: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter by name, tied ones included under each name."""
    return dict(module.named_parameters(remove_duplicate=False))


def assert_same_objects(before: dict[str, nn.Parameter], module: nn.Module) -> None:
    after = objects(module)
    assert after.keys() == before.keys()
    for name, p in after.items():
        assert p is before[name], f"{name} is a new object after the move"


def assert_on(module: nn.Module, device: str) -> None:
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        assert t.device.type == device, f"{name} is on {t.device}"


def assert_values(module: nn.Module, reference: nn.Module, **tol: float) -> None:
    expected = reference.state_dict()
    for name, t in module.state_dict().items():
        torch.testing.assert_close(t.cpu(), expected[name].cpu(), msg=lambda m, n=name: f"{n}: {m}", **tol)


def train(module: nn.Module, optimizer: torch.optim.Optimizer, device: str, seeds: range) -> list[float]:
    losses = []
    for seed in seeds:
        optimizer.zero_grad()
        loss = module(sample(seed).to(device)).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# -- the compatibility answer --------------------------------------------------------


def test_plugin_tensors_are_shallow_copy_compatible_with_dense_tensors() -> None:
    compatible = torch._has_compatible_shallow_copy_type
    cpu, dev = torch.zeros(2), torch.zeros(2, device=DEVICE)
    assert compatible(cpu, dev) and compatible(dev, cpu) and compatible(dev, dev)
    assert compatible(dev, torch.zeros(2, dtype=torch.int64, device=DEVICE))
    assert compatible(dev, torch.zeros(2, dtype=torch.float64))
    # PyTorch's own answers stay: meta and sparse tensors are not dense backends.
    meta = torch.zeros(2, device="meta")
    assert not compatible(dev, meta) and not compatible(meta, dev)
    assert not compatible(cpu, meta)
    assert not compatible(dev, torch.zeros(2).to_sparse())
    assert compatible(cpu, torch.zeros(3, dtype=torch.int8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device next to the plugin device")
def test_plugin_tensors_are_shallow_copy_compatible_with_cuda_tensors() -> None:
    # As CPU and CUDA tensors are with each other (the upstream fix's answer).
    cuda, dev = torch.zeros(2, device="cuda"), torch.zeros(2, device=DEVICE)
    assert torch._has_compatible_shallow_copy_type(cuda, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cuda)
    p = nn.Parameter(torch.zeros(2, device="cuda"))
    p.data = dev
    assert p.device.type == DEVICE and isinstance(p, nn.Parameter)


# -- Module.to / Module.<device>() / .cpu() ------------------------------------------


def test_to_device_keeps_every_parameter_object_and_ties() -> None:
    model, reference = tied(), tied()
    before = objects(model)
    assert model.to(DEVICE) is model
    assert_same_objects(before, model)
    assert model.b.weight is model.a.weight
    assert_on(model, DEVICE)
    assert_values(model, reference, rtol=0, atol=0)


def test_device_method_cpu_and_back_keep_identity_and_ties() -> None:
    model, reference = tied(), tied()
    before = objects(model)
    for move in (lambda m: getattr(m, DEVICE)(), nn.Module.cpu, lambda m: m.to(DEVICE), lambda m: m.to("cpu")):
        move(model)
        assert_same_objects(before, model)
        assert model.b.weight is model.a.weight
        assert_values(model, reference, rtol=0, atol=0)
    assert_on(model, "cpu")
    getattr(model, DEVICE)(0)
    assert model.a.weight.device == torch.device(DEVICE, 0)
    assert_same_objects(before, model)


def test_dtype_conversions_on_the_device_keep_identity() -> None:
    model, reference = tied(torch.float32), tied(torch.float32)
    before = objects(model)
    model.to(DEVICE).to(torch.float64)
    assert_same_objects(before, model)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert_on(model, DEVICE)
    model.float()
    model.to("cpu", torch.float64).to(DEVICE, torch.float32)
    assert_same_objects(before, model)
    assert model.b.weight is model.a.weight
    assert_values(model, reference, rtol=0, atol=0)


def test_requires_grad_and_parameter_subclass_survive_the_move() -> None:
    model = tied()
    model.a.bias = ScaledParameter(torch.ones(4, dtype=torch.float64))
    model.to(DEVICE)
    assert type(model.a.bias) is ScaledParameter
    assert model.a.bias.device.type == DEVICE
    assert model.a.weight.requires_grad and model.a.weight.is_leaf
    assert not model.frozen.weight.requires_grad and not model.frozen.bias.requires_grad
    model.cpu()
    assert type(model.a.bias) is ScaledParameter
    assert not model.frozen.weight.requires_grad


def test_swap_tensors_future_flag_keeps_identity_too() -> None:
    model, reference = tied(), tied()
    before = objects(model)
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to(DEVICE)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
    assert_same_objects(before, model)
    assert_on(model, DEVICE)
    assert_values(model, reference, rtol=0, atol=0)


# -- .data assignment ------------------------------------------------------------------


def test_data_assignment_moves_a_parameter_between_cpu_and_device() -> None:
    p = nn.Parameter(torch.arange(4.0))
    p.data = torch.full((2, 2), 3.0, device=DEVICE)
    assert isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
    assert p.device.type == DEVICE and p.shape == (2, 2)
    torch.testing.assert_close(p.cpu(), torch.full((2, 2), 3.0))
    p.sum().backward()
    assert p.grad is not None and p.grad.device.type == DEVICE
    p.data = torch.zeros(3)
    assert p.device.type == "cpu"
    p.grad = None
    (p * 2).sum().backward()
    torch.testing.assert_close(p.grad, torch.full((3,), 2.0))


def test_data_assignment_keeps_pytorchs_checks() -> None:
    p = nn.Parameter(torch.zeros(2, device=DEVICE))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        p.data = torch.zeros(2, device="meta")
    with pytest.raises(RuntimeError, match="floating point or complex"):
        p.data = torch.zeros(2, dtype=torch.int64)
    assert p.device.type == DEVICE
    t = torch.zeros(2)
    t.data = torch.ones(2, dtype=torch.int64, device=DEVICE)
    assert t.device.type == DEVICE and t.dtype == torch.int64


# -- gradients, hooks and optimizers ---------------------------------------------


def test_existing_gradients_move_with_the_module() -> None:
    model, reference = tied(), tied()
    for m in (model, reference):
        m(sample(1)).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["frozen.weight"] is None
    model.to(DEVICE)
    for name, p in model.named_parameters():
        assert p.grad is grads[name], f"{name}: the gradient is a new object"
        if p.grad is not None:
            assert p.grad.device.type == DEVICE
    # A backward on the device accumulates into the moved gradients.
    model(sample(1).to(DEVICE)).sum().backward()
    reference(sample(1)).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is not None:
            torch.testing.assert_close(p.grad.cpu(), q.grad, msg=lambda m, n=name: f"{n}: {m}")


def test_tensor_hooks_registered_before_the_move_still_fire() -> None:
    model = tied()
    seen: list[torch.device] = []
    model.a.weight.register_hook(lambda g: seen.append(g.device))
    model.to(DEVICE)(sample(2).to(DEVICE)).sum().backward()
    assert seen == [torch.device(DEVICE, 0)]


def sgd_momentum(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def adam(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


def adamw(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


OPTIMIZERS = [sgd_momentum, adam, adamw]


@pytest.mark.parametrize("make", OPTIMIZERS, ids=lambda f: f.__name__)
def test_an_optimizer_created_before_to_trains_the_moved_model(
    make: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
) -> None:
    model, reference = tied(), tied()
    optimizer = make(model.parameters())
    model.to(DEVICE)
    dev_losses = train(model, optimizer, DEVICE, range(4))
    cpu_losses = train(reference, make(reference.parameters()), "cpu", range(4))
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-10, atol=1e-12)
    assert_values(model, reference, rtol=1e-10, atol=1e-12)
    assert model.b.weight is model.a.weight
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step":
                assert value.device.type == DEVICE, key


@pytest.mark.parametrize("make", OPTIMIZERS, ids=lambda f: f.__name__)
def test_optimizer_state_follows_the_parameters_after_a_move(
    make: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
) -> None:
    # As on CUDA: Module.to moves parameters, not optimizer state; reloading
    # the optimizer's state dict casts its state to each parameter's device.
    model, reference = tied(), tied()
    optimizer = make(model.parameters())
    train(model, optimizer, "cpu", range(2))
    model.to(DEVICE)
    optimizer.load_state_dict(optimizer.state_dict())
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step":
                assert value.device.type == DEVICE, key
    dev_losses = train(model, optimizer, DEVICE, range(2, 4))
    model.cpu()
    optimizer.load_state_dict(optimizer.state_dict())
    dev_losses += train(model, optimizer, "cpu", range(4, 5))
    cpu_losses = train(reference, make(reference.parameters()), "cpu", range(5))[2:]
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-10, atol=1e-12)
    assert_values(model, reference, rtol=1e-10, atol=1e-12)


def test_stale_optimizer_state_on_the_cpu_is_an_error_not_silent() -> None:
    # CUDA raises too: the momentum buffers stay on the CPU while the
    # parameters and gradients are on the device.
    model = tied()
    optimizer = sgd_momentum(model.parameters())
    train(model, optimizer, "cpu", range(1))
    model.to(DEVICE)
    with pytest.raises(RuntimeError):
        train(model, optimizer, DEVICE, range(1, 2))


# -- load_state_dict ---------------------------------------------------------------


@pytest.mark.parametrize("source", ["cpu", DEVICE])
def test_load_state_dict_copies_into_the_device_parameters(source: str) -> None:
    model = tied().to(DEVICE)
    before = objects(model)
    trained = tied()
    train(trained, sgd_momentum(trained.parameters()), "cpu", range(2))
    model.load_state_dict(trained.to(source).state_dict())
    assert_same_objects(before, model)
    assert model.b.weight is model.a.weight
    assert_on(model, DEVICE)
    assert_values(model, trained, rtol=0, atol=0)


@pytest.mark.parametrize("source", ["cpu", DEVICE])
def test_load_state_dict_with_assign_takes_the_state_dict_tensors(source: str) -> None:
    # As on CUDA and the CPU: assign=True replaces the parameters by the
    # state dict's tensors, on the state dict's device, keeping requires_grad.
    trained = tied()
    train(trained, sgd_momentum(trained.parameters()), "cpu", range(2))
    state = trained.to(source).state_dict()
    still_tied = {}
    for device in ("cpu", DEVICE):
        model = tied().to(device)
        model.load_state_dict(state, assign=True)
        for name, p in model.named_parameters():
            assert isinstance(p, nn.Parameter), name
            assert p.device.type == source, name
            assert p.data_ptr() == state[name].data_ptr(), name
        assert not model.frozen.weight.requires_grad and model.a.weight.requires_grad
        assert_values(model, trained, rtol=0, atol=0)
        still_tied[device] = model.b.weight is model.a.weight
    # Whatever assign=True does to tied weights, it does the same on both devices.
    assert still_tied[DEVICE] == still_tied["cpu"]


# -- deepcopy and parametrizations ---------------------------------------------------


def test_deepcopy_of_a_device_module_keeps_ties_within_the_copy() -> None:
    model = tied().to(DEVICE)
    clone = copy.deepcopy(model)
    assert clone.b.weight is clone.a.weight
    assert clone.a.weight is not model.a.weight
    assert clone.a.weight.data_ptr() != model.a.weight.data_ptr()
    assert_on(clone, DEVICE)
    assert_values(clone, model, rtol=0, atol=0)
    assert not clone.frozen.weight.requires_grad
    before = objects(clone)
    clone.cpu()
    assert_same_objects(before, clone)


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(0, 1)

    def right_inverse(self, a: torch.Tensor) -> torch.Tensor:
        return a.triu()


def test_parametrized_module_moves_with_its_original() -> None:
    model, reference = nn.Linear(4, 4).double(), nn.Linear(4, 4).double()
    reference.load_state_dict(model.state_dict())
    for m in (model, reference):
        parametrize.register_parametrization(m, "weight", Symmetric())
    original = model.parametrizations.weight.original
    model.to(DEVICE)
    assert model.parametrizations.weight.original is original
    assert original.device.type == DEVICE
    torch.testing.assert_close(model.weight.cpu(), reference.weight, rtol=0, atol=0)
    optimizer = sgd_momentum(model.parameters())
    dev_losses = train(model, optimizer, DEVICE, range(3))
    cpu_losses = train(reference, sgd_momentum(reference.parameters()), "cpu", range(3))
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-10, atol=1e-12)
    # Assigning the parametrized weight on the device goes through right_inverse and set_.
    value = torch.randn(4, 4, dtype=torch.float64)
    model.weight = value.to(DEVICE)
    reference.weight = value
    assert model.parametrizations.weight.original is original
    torch.testing.assert_close(model.weight.cpu(), reference.weight, rtol=0, atol=0)
    model.cpu()
    assert model.parametrizations.weight.original is original


def test_parametrization_registered_on_the_device() -> None:
    model = nn.Linear(4, 4).double().to(DEVICE)
    weight = model.weight.detach().cpu()
    parametrize.register_parametrization(model, "weight", Symmetric())
    original = model.parametrizations.weight.original
    assert original.device.type == DEVICE
    model.cpu()
    assert model.parametrizations.weight.original is original
    torch.testing.assert_close(model.weight, Symmetric()(weight.triu()), rtol=0, atol=0)


# -- acceptance: a GPT-style language model with tied embeddings ---------------------


def gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT().double()


def test_gpt_with_tied_embeddings_trains_on_the_device_like_the_cpu() -> None:
    cpu_model, dev_model = gpt(), gpt()
    dev_model.to(DEVICE)
    assert dev_model.head.weight is dev_model.tok.weight
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2, weight_decay=0.1)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        tokens = torch.randint(0, 64, (4, 16), generator=g)
        losses = []
        for model, opt, device in ((cpu_model, cpu_opt, "cpu"), (dev_model, dev_opt, DEVICE)):
            opt.zero_grad()
            x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1].cpu(), losses[0], rtol=1e-10, atol=1e-12, msg=f"loss at step {step}")
        cpu_grads = dict(cpu_model.named_parameters())
        for name, p in dev_model.named_parameters():
            assert p.grad is not None and p.grad.device.type == DEVICE, name
            torch.testing.assert_close(
                p.grad.cpu(),
                cpu_grads[name].grad,
                rtol=1e-9,
                atol=1e-11,
                msg=lambda m, n=name, s=step: f"{n} @ {s}: {m}",
            )
        cpu_opt.step()
        dev_opt.step()
    assert dev_model.head.weight is dev_model.tok.weight
    assert_values(dev_model, cpu_model, rtol=1e-9, atol=1e-11)

"""Language models on the device: GPT-, Llama- and BERT-style training and generation agree with the CPU.

The models (:mod:`torch_fl.lm`, plain ``torch.nn``) are small (two layers,
width 32, sequences of 12-16 tokens) so the module runs in seconds; they
dispatch the operators larger ones do. Every workload here runs with the
CPU fallback switched to an error, so a missing kernel fails the test
instead of passing slowly. The operators they need are checked one by one in
``test_language_model_operators.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from torch_fl.lm import GPT, Bert, Llama, beam_search, generate, mlm_batch, token_logprobs

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

VOCAB, BATCH, SEQ = 64, 4, 12
IGNORE = -100

MODELS: dict[str, Callable[[], torch.nn.Module]] = {"gpt": GPT, "llama": Llama, "bert": Bert}


@pytest.fixture
def native_only() -> Iterator[None]:
    """Runs the test with the CPU fallback raising, and checks no operator fell back."""
    before = torch_fl.fallback_mode()
    torch_fl.set_fallback_mode("error")
    torch_fl.reset_fallback_stats()
    try:
        yield
    finally:
        torch_fl.set_fallback_mode(before)
    assert torch_fl.fallback_stats() == {}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token labels; a few labels (and BERT's padding) are ignored."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    tokens[0, -3:] = 0  # padding at the end of the first row
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels[0, -3:] = IGNORE
    labels[1, :2] = IGNORE
    return tokens, labels


def loss_of(model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE)


def train(
    model: torch.nn.Module, device: str, steps: int, *, amp: bool = False, fused: bool = False
) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """AdamW (foreach or fused) with gradient clipping; returns each step's loss and gradients (on the CPU)."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, weight_decay=0.1, foreach=None if fused else True, fused=fused or None
    )
    history = []
    for step in range(steps):
        tokens, labels = (t.to(device) for t in batch(step))
        optimizer.zero_grad()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            loss = loss_of(model, tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        history.append((loss.item(), {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}))
        optimizer.step()
    return history


# -- training agrees with the CPU ----------------------------------------------------

# Tolerances for float32. The device and the CPU sum matrix products and
# reductions in different orders, so results differ in the last bits: over
# three AdamW steps of these models the losses differ by about 1e-7
# (relative) and gradients by at most 1e-7 (absolute, on entries of 1e-3 to
# 1). rtol 1e-5 / atol 1e-6 leaves ~100x headroom over that noise, while a
# wrong kernel (an off-by-one mask, a dropped or repeated element) is off by
# orders of magnitude more.
RTOL, ATOL = 1e-5, 1e-6
# Parameters after the steps: Adam divides each gradient by its own running
# magnitude, so a gradient that is tiny (1e-7, near Adam's eps) and differs in
# its last bits moves its weight by a visibly different fraction of the
# learning rate (1e-3). Observed: 4e-7; allowed: 1% of one step.
PARAM_ATOL = 1e-5


def trained_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters after training, less the attention key biases.

    A key bias adds the same amount to every score of a query, which softmax
    ignores: its gradient is zero up to rounding noise, and Adam scales that
    noise to full-size steps (the CPU's and the device's noise differ). It
    changes no loss or other gradient, which the test compares every step.
    """
    out = {}
    for name, p in model.named_parameters():
        p = p.detach().cpu()
        if name.endswith("qkv.bias"):
            width = p.shape[0] // 3
            p = torch.cat([p[:width], p[2 * width :]])
        out[name] = p
    return out


@pytest.mark.parametrize("name", MODELS)
def test_training_steps_match_the_cpu_in_float32(name: str, native_only) -> None:
    cpu_model = build(name)
    dev_model = copy.deepcopy(cpu_model)
    expected = train(cpu_model, "cpu", steps=3)
    actual = train(dev_model, DEVICE, steps=3)
    for step, ((cpu_loss, cpu_grads), (dev_loss, dev_grads)) in enumerate(zip(expected, actual, strict=True)):
        assert dev_loss == pytest.approx(cpu_loss, rel=RTOL), f"step {step}"
        assert dev_grads.keys() == cpu_grads.keys()
        for param, g in cpu_grads.items():
            torch.testing.assert_close(
                dev_grads[param], g, rtol=RTOL, atol=ATOL, msg=lambda m, p=param, s=step: f"step {s}, {p}: {m}"
            )
    final = trained_parameters(dev_model)
    for param, p in trained_parameters(cpu_model).items():
        torch.testing.assert_close(final[param], p, rtol=RTOL, atol=PARAM_ATOL, msg=param)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_training_stays_close_to_float32_on_the_cpu(name: str, native_only) -> None:
    # bfloat16 keeps 8 significant bits (0.4% per rounding): matrix products
    # in bf16 through two layers and back land within a few percent of the
    # float32 result. The bounds below are about twice what the models show.
    cpu_model = build(name)
    dev_model = copy.deepcopy(cpu_model)
    expected = train(cpu_model, "cpu", steps=2)
    actual = train(dev_model, DEVICE, steps=2, amp=True)
    for (cpu_loss, cpu_grads), (dev_loss, dev_grads) in zip(expected, actual, strict=True):
        assert dev_loss == pytest.approx(cpu_loss, rel=2e-2)
        for param, g in cpu_grads.items():
            assert dev_grads[param].dtype == torch.float32, "autocast keeps parameters and gradients in float32"
            assert relative_error(dev_grads[param], g) < 0.1, param


def test_fused_adamw_trains_on_the_device_like_the_cpu(native_only) -> None:
    cpu_model = build("gpt")
    dev_model = copy.deepcopy(cpu_model)
    expected = train(cpu_model, "cpu", steps=3, fused=True)
    actual = train(dev_model, DEVICE, steps=3, fused=True)
    for (cpu_loss, _), (dev_loss, _) in zip(expected, actual, strict=True):
        assert dev_loss == pytest.approx(cpu_loss, rel=RTOL)
    final = trained_parameters(dev_model)
    for param, p in trained_parameters(cpu_model).items():
        torch.testing.assert_close(final[param], p, rtol=RTOL, atol=PARAM_ATOL, msg=param)


def test_evaluation_matches_the_cpu(native_only) -> None:
    tokens, _ = batch(7)
    for name in MODELS:
        model = build(name).eval()
        with torch.no_grad():
            expected = model(tokens)
            actual = copy.deepcopy(model).to(DEVICE)(tokens.to(DEVICE))
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5, msg=name)


def test_token_logprobs_and_their_gradients_match_the_cpu(native_only) -> None:
    # gather forward, scatter_add backward.
    tokens, _ = batch(3)
    results = []
    for device in ("cpu", DEVICE):
        model = build("gpt").to(device)
        lp = token_logprobs(model, tokens.to(device))
        lp.sum().backward()
        results.append((lp.detach().cpu(), model.wte.weight.grad.cpu()))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)


# -- generation ----------------------------------------------------------------------


def prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 4), generator=torch.Generator().manual_seed(11))


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_greedy_generation_produces_the_cpus_tokens(name: str, native_only) -> None:
    model = build(name).eval()
    expected = generate(model, prompt(), 10, greedy=True)
    actual = generate(copy.deepcopy(model).to(DEVICE), prompt().to(DEVICE), 10, greedy=True)
    assert torch.equal(actual.cpu(), expected)


def test_beam_search_matches_the_cpu(native_only) -> None:
    model = build("gpt").eval()
    seqs, scores = beam_search(model, prompt(), 6)
    dev_seqs, dev_scores = beam_search(copy.deepcopy(model).to(DEVICE), prompt().to(DEVICE), 6)
    assert torch.equal(dev_seqs.cpu(), seqs)
    torch.testing.assert_close(dev_scores.cpu(), scores, rtol=1e-4, atol=1e-5)


SAMPLERS = {
    "temperature": {"temperature": 0.7},
    "top-k": {"top_k": 5},
    "top-p": {"top_p": 0.8},
    "top-k+top-p": {"temperature": 1.3, "top_k": 10, "top_p": 0.9},
}


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_sampled_generation_reproduces_with_the_same_seed(sampler: str, native_only) -> None:
    model = build("llama").eval().to(DEVICE)
    kwargs = SAMPLERS[sampler]

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator(DEVICE).manual_seed(seed)
        return generate(model, prompt().to(DEVICE), 12, generator=g, **kwargs).cpu()

    first, again, other = run(1), run(1), run(2)
    assert torch.equal(first, again)
    assert not torch.equal(first, other), "another seed samples other tokens"
    torch.manual_seed(5)
    a = generate(model, prompt().to(DEVICE), 12, **kwargs).cpu()
    torch.manual_seed(5)
    b = generate(model, prompt().to(DEVICE), 12, **kwargs).cpu()
    assert torch.equal(a, b), "torch.manual_seed seeds the device generator"


@pytest.mark.parametrize("sampler", ["top-k", "top-p"])
def test_sampled_tokens_respect_the_filter(sampler: str, native_only) -> None:
    # Each sampled token must be one the CPU's filter keeps for that prefix.
    model = build("gpt").eval()
    dev = copy.deepcopy(model).to(DEVICE)
    g = torch.Generator(DEVICE).manual_seed(3)
    tokens = generate(dev, prompt().to(DEVICE), 8, generator=g, **SAMPLERS[sampler]).cpu()
    from torch_fl.lm import _filter_logits

    with torch.no_grad():
        for t in range(prompt().shape[1], tokens.shape[1]):
            logits = _filter_logits(
                model(tokens[:, :t])[:, -1, :], **{"top_k": None, "top_p": None, **SAMPLERS[sampler]}
            )
            allowed = torch.isfinite(logits)
            assert allowed.gather(1, tokens[:, t : t + 1]).all(), f"position {t}"


def test_generation_stops_at_end_of_sequence_tokens(native_only) -> None:
    # An untrained GPT's tied embeddings favour repeating the last token;
    # Llama's separate output projection samples widely.
    model = build("llama").eval().to(DEVICE)
    eos = torch.arange(3, 19)  # a quarter of the vocabulary: every row soon samples one
    g = torch.Generator(DEVICE).manual_seed(0)
    out = generate(model, prompt().to(DEVICE), 40, temperature=2.0, eos_ids=dev(eos), generator=g).cpu()
    assert out.shape[1] < prompt().shape[1] + 40, "the loop stopped once every row had finished"
    for row in out[:, prompt().shape[1] :]:
        first = int(torch.isin(row, eos).nonzero()[0, 0])
        assert (row[first + 1 :] == eos[0]).all(), "a finished row repeats the first EOS id"


def dev(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEVICE)


def test_masked_lm_batches_are_built_on_the_device(native_only) -> None:
    tokens, _ = batch(4)
    g = torch.Generator(DEVICE).manual_seed(0)
    inputs, labels = mlm_batch(tokens.to(DEVICE), VOCAB, p=0.5, generator=g)
    inputs, labels = inputs.cpu(), labels.cpu()
    chosen = labels != IGNORE
    assert chosen.any() and not chosen[tokens < 3].any(), "special tokens are never chosen"
    assert torch.equal(labels[chosen], tokens[chosen])
    assert torch.equal(inputs[~chosen], tokens[~chosen])
    model = build("bert").to(DEVICE)
    loss = F.cross_entropy(model(inputs.to(DEVICE)).reshape(-1, VOCAB), labels.to(DEVICE).reshape(-1))
    loss.backward()
    assert torch.isfinite(loss).item()


def test_the_demo_trains_a_gpt_and_reports_tokens_per_second() -> None:
    result = run_python(
        "import torch_fl.demo; torch_fl.demo.main("
        "['--model', 'gpt', '--steps', '3', '--cpu-steps', '2', '--batch-size', '2', '--context', '16'])"
    )
    out = assert_ok(result)
    assert "training gpt on synthetic token sequences" in out, out
    assert "throughput: sim" in out and "tok/s" in out, out
    assert "greedy continuation on sim" in out, out
    assert "fallback operators: 0 (0 calls)" in out, out
    assert "tok/s" in result.stderr, "the progress bar goes to stderr"

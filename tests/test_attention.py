"""Fused attention through PyTorch's overrideable route, and the eval fast paths of attention modules.

``F.scaled_dot_product_attention`` on the device runs the plugin's
``_scaled_dot_product_fused_attention_overrideable`` (and its backward) when
the plugin's op table offers it, and the math path otherwise. Compared here:
the fused kernel against the CPU's math path and the device's own math path
(``sdpa_kernel(SDPBackend.MATH)``), forward and backward, without masks,
causal, with boolean and additive masks (the additive one also as a gradient
target), grouped-query heads, half types, fully masked rows and dropout
(reproducible from the seed; its mask recovered and checked against the math
path given that mask). That the fused kernel ran is shown by the profiler
(the operator, not the math path's matmuls and softmax) and by device memory:
its peak stays below one ``L x S`` probability matrix, which the math path
materialises. A plugin without the kernel gets the math path.

``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` in eval mode call
``_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd``, which
torch-fl composes on the device: equal to the CPU's, with the CPU fallback
turned into an error.

Tolerances: float32 against the CPU's float32 math path ``atol=rtol=1e-5``
(the summation order differs: a blocked online softmax against one softmax;
observed differences are below 2e-6); float16 and bfloat16 against a float32
reference on the same rounded inputs ``atol=rtol=2e-3`` and ``2e-2`` (the
kernel computes in float32 and rounds its results once; observed: 6e-4 and
5e-3).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.profiler import profile
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_fl

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"
F32 = {"atol": 1e-5, "rtol": 1e-5}
HALF = {torch.float16: {"atol": 2e-3, "rtol": 2e-3}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture
def no_fallbacks() -> Iterator[None]:
    """Makes any CPU fallback an error while the test runs (TORCH_FL_FALLBACK=error)."""
    torch_fl.reset_fallback_stats()
    torch_fl.set_fallback_mode("error")
    try:
        yield
    finally:
        torch_fl.set_fallback_mode("cpu")
    assert torch_fl.fallback_stats() == {}


def qkv(b: int, hq: int, hkv: int, length: int, s: int, e: int, seed: int = 0) -> list[torch.Tensor]:
    """Query ``(b, hq, length, e)``, key and value ``(b, hkv, s, e)``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, e, generator=g) for h, n in ((hq, length), (hkv, s), (hkv, s))]


def run_sdpa(
    device: str, tensors: list[torch.Tensor], mask: torch.Tensor | None, backend: SDPBackend | None, **kw: object
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Output and the gradients of (q, k, v, mask) of ``sum(out * w)``, on ``device``, back on the CPU."""
    leaves = [t.detach().to(device).requires_grad_() for t in tensors]
    m = None if mask is None else mask.detach().to(device).requires_grad_(mask.requires_grad)
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    with ctx:
        out = F.scaled_dot_product_attention(*leaves, attn_mask=m, **kw)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape).to(device)
    (out * weights).sum().backward()
    grads = [t.grad for t in leaves] + [None if m is None or not m.requires_grad else m.grad]
    return out.detach().cpu(), [None if g is None else g.cpu() for g in grads]


def check(
    actual: tuple[torch.Tensor, list[torch.Tensor | None]], expected: tuple[torch.Tensor, list], **tol: float
) -> None:
    torch.testing.assert_close(actual[0], expected[0], **tol)
    for name, a, e in zip(("query", "key", "value", "mask"), actual[1], expected[1], strict=True):
        assert (a is None) == (e is None), name
        if a is not None:
            torch.testing.assert_close(a, e, **tol, msg=lambda m, n=name: f"grad of {n}: {m}")


def profiled_ops(fn: Callable[[], object]) -> set[str]:
    with profile(use_device=DEVICE) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


# --------------------------------------------------------------------- choice


def test_the_backend_choice_follows_the_op_table_and_the_inputs() -> None:
    q, k, v = (t.to(DEVICE) for t in qkv(2, 4, 4, 8, 8, 16))
    choice = torch._fused_sdp_choice
    assert choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    assert choice(q, k, v, dropout_p=0.2, is_causal=True) == SDPBackend.OVERRIDEABLE.value
    assert choice(q, k[:, :2], v[:, :2], enable_gqa=True) == SDPBackend.OVERRIDEABLE.value
    # Inputs the fused kernel does not take: the math path, which then
    # computes them or raises PyTorch's error.
    assert choice(q, k[:, :2], v[:, :2]) == SDPBackend.MATH.value
    assert choice(q.double(), k.double(), v.double()) == SDPBackend.MATH.value
    assert choice(q[0], k[0], v[0]) == SDPBackend.MATH.value
    mask = torch.ones(8, 8, dtype=torch.bool, device=DEVICE)
    assert choice(q, k, v, mask) == SDPBackend.OVERRIDEABLE.value
    assert choice(q, k, v, mask, is_causal=True) == SDPBackend.MATH.value
    # The user's backend selection is honoured, as on CUDA.
    with sdpa_kernel([SDPBackend.MATH]):
        assert choice(q, k, v) == SDPBackend.MATH.value
    with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
        assert choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
        with pytest.raises(RuntimeError, match=r"No available kernel.*on sim.*dtype"):
            choice(q.double(), k.double(), v.double())


# ------------------------------------------------------- fused against math


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
    "gqa": {"enable_gqa": True, "is_causal": True},
    "bool-mask": {"mask": "bool"},
    "additive-mask": {"mask": "additive"},
    "mask-grad": {"mask": "grad"},
}


def case_inputs(name: str) -> tuple[list[torch.Tensor], torch.Tensor | None, dict[str, object]]:
    kw = dict(CASES[name])
    kind = kw.pop("mask", None)
    hkv = 2 if kw.get("enable_gqa") else 4
    # L != S and more than one block of 64 keys.
    tensors = qkv(2, 4, hkv, 70 if kind is None else 20, 70 if kw.get("is_causal") else 90, 16, seed=len(name))
    g = torch.Generator().manual_seed(1)
    mask = None
    if kind == "bool":
        mask = torch.rand(2, 1, tensors[0].shape[2], 90, generator=g) > 0.3
    elif kind is not None:
        mask = torch.randn(tensors[0].shape[2], 90, generator=g).requires_grad_(kind == "grad")
    return tensors, mask, kw


@pytest.mark.parametrize("name", list(CASES))
def test_fused_attention_matches_the_math_path_forward_and_backward(name: str) -> None:
    tensors, mask, kw = case_inputs(name)
    with profile(use_device=DEVICE) as prof:
        fused = run_sdpa(DEVICE, tensors, mask, None, **kw)
    ops = {e.key for e in prof.key_averages()}
    assert {FUSED, FUSED_BACKWARD} <= ops, sorted(ops)
    assert not {"aten::bmm", "aten::_softmax"} & ops, sorted(ops)
    cpu_math = run_sdpa("cpu", tensors, mask, SDPBackend.MATH, **kw)
    check(fused, cpu_math, **F32)
    if not kw.get("is_causal"):  # the device's math path builds its causal mask with tril
        check(fused, run_sdpa(DEVICE, tensors, mask, SDPBackend.MATH, **kw), **F32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_are_computed_in_float32(dtype: torch.dtype) -> None:
    tensors = [t.to(dtype) for t in qkv(2, 4, 2, 33, 70, 16, seed=3)]
    mask = torch.randn(33, 70).to(dtype)
    reference = run_sdpa("cpu", [t.float() for t in tensors], mask.float(), SDPBackend.MATH, enable_gqa=True)
    fused = run_sdpa(DEVICE, tensors, mask, None, enable_gqa=True)
    assert fused[0].dtype == dtype
    to_float = (fused[0].float(), [None if g is None else g.float() for g in fused[1]])
    check(to_float, reference, **HALF[dtype])


def test_fully_masked_rows_attend_to_nothing() -> None:
    tensors = qkv(1, 2, 2, 4, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    fused = run_sdpa(DEVICE, tensors, mask, None)
    assert torch.equal(fused[0][:, :, 2], torch.zeros(1, 2, 8))
    check(fused, run_sdpa("cpu", tensors, mask, SDPBackend.MATH), **F32)


# ------------------------------------------------------------------ dropout


def test_dropout_reproduces_from_the_seed() -> None:
    q, k, v = (t.to(DEVICE) for t in qkv(2, 2, 2, 16, 16, 8))

    def draw(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()

    first, again, other = draw(7), draw(7), draw(8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # Consecutive calls draw fresh masks (the generator advances).
    torch.manual_seed(7)
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.equal(first, F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu())
    with torch.random.fork_rng(devices=[0], device_type=DEVICE):
        inside = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    assert torch.equal(inside, F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu())


def test_dropout_gradients_use_the_forward_mask() -> None:
    """With identity values the output is the dropped probabilities: that reveals the mask, and the
    math path given the same mask must produce the fused kernel's outputs and gradients."""
    b, h, length, s, p = 2, 2, 12, 20, 0.3
    q, k, _ = qkv(b, h, h, length, s, 8, seed=5)
    eye = torch.eye(s).expand(b, h, s, s)
    torch.manual_seed(11)
    dropped = F.scaled_dot_product_attention(q.to(DEVICE), k.to(DEVICE), eye.to(DEVICE), dropout_p=p).cpu()
    mask = dropped != 0
    assert 0.6 < mask.float().mean() < 0.8
    v = torch.randn(b, h, s, 8)
    torch.manual_seed(11)  # the same mask again
    fused = run_sdpa(DEVICE, [q, k, v], None, None, dropout_p=p)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():  # "Dropout mask should only be used for testing purposes."
        warnings.simplefilter("ignore")
        out, _ = torch.ops.aten._scaled_dot_product_attention_math(*leaves, dropout_p=p, dropout_mask=mask)
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    check(fused, (out.detach(), [t.grad for t in leaves] + [None]), **F32)


def test_compiled_attention_keeps_the_fused_kernel() -> None:
    """Dynamo traces with fake tensors: the backend choice and the operator's meta must agree with eager."""
    tensors = qkv(2, 4, 2, 16, 16, 8)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = torch.compile(attend, backend="aot_eager")
    leaves = [t.to(DEVICE).requires_grad_() for t in tensors]
    ops = profiled_ops(lambda: compiled(*leaves).sum().backward())
    assert {FUSED, FUSED_BACKWARD} <= ops, sorted(ops)
    cpu_leaves = [t.clone().requires_grad_() for t in tensors]
    with sdpa_kernel([SDPBackend.MATH]):
        expected = attend(*cpu_leaves)
    expected.sum().backward()
    torch.testing.assert_close(compiled(*leaves).detach().cpu(), expected.detach(), **F32)
    for leaf, cpu_leaf in zip(leaves, cpu_leaves, strict=True):
        assert leaf.grad is not None
        torch.testing.assert_close(leaf.grad.cpu(), cpu_leaf.grad, **F32)


# ------------------------------------------------------------- proof of route


def test_the_fused_kernel_never_materialises_the_attention_matrix() -> None:
    """The probabilities of one (L, S) head pair are 1 MiB here: the fused kernel's forward and backward
    allocate far less than one of them, the math path several."""
    tensors = qkv(1, 2, 2, 512, 512, 16)
    probs_bytes = 2 * 512 * 512 * 4

    def peak(backend: SDPBackend | None) -> int:
        leaves = [t.to(DEVICE).requires_grad_() for t in tensors]
        torch.sim.synchronize()
        torch.sim.reset_peak_memory_stats()
        base = torch.sim.memory_allocated()
        with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
            F.scaled_dot_product_attention(*leaves).sum().backward()
        torch.sim.synchronize()
        return torch.sim.max_memory_allocated() - base

    fused, math = peak(None), peak(SDPBackend.MATH)
    assert fused < probs_bytes / 4, (fused, math)
    assert math > probs_bytes, (fused, math)


def test_the_math_path_serves_the_device_when_asked(no_fallbacks: None) -> None:
    tensors = qkv(1, 2, 2, 8, 8, 8)
    ops = profiled_ops(lambda: run_sdpa(DEVICE, tensors, None, SDPBackend.MATH))
    assert FUSED not in ops and "aten::bmm" in ops, sorted(ops)


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
def test_a_plugin_without_the_fused_kernel_gets_the_math_path(fixture_plugin: Callable[..., Path]) -> None:
    """The minimal C plugin has no attention kernel: the math path runs (its operators fall back)."""
    path = fixture_plugin("good")
    result = run_python(
        f"""
        import torch, torch.nn.functional as F, torch_fl
        from torch.nn.attention import SDPBackend
        torch_fl.register_device_plugin(name="minimal_c", plugin_path={str(path)!r})
        q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
        d = [t.to("minimal_c") for t in (q, k, v)]
        assert torch._fused_sdp_choice(*d) == SDPBackend.MATH.value
        torch_fl.reset_fallback_stats()
        out = F.scaled_dot_product_attention(*d)
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v))
        stats = torch_fl.fallback_stats()
        assert not any("fused_attention" in op for op in stats), stats
        assert any(op.startswith("bmm") for op in stats), stats
        print("math")
        """,
        timeout=120,
    )
    assert assert_ok(result).strip().endswith("math")


# ------------------------------------------------------------- eval fast paths


def attention_module(width: int = 32, heads: int = 4) -> torch.nn.MultiheadAttention:
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(width, heads, batch_first=True).eval()


@pytest.mark.parametrize("masks", ["none", "padding", "attn", "both"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_eval_fast_path_runs_on_the_device(
    masks: str, need_weights: bool, no_fallbacks: None
) -> None:
    cpu = attention_module()
    dev = attention_module().to(DEVICE)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 10, 32, generator=g)
    padding = torch.zeros(3, 10, dtype=torch.bool)
    padding[0, 7:] = True
    padding[2, 4:] = True
    attn = torch.rand(10, 10, generator=g) > 0.8
    kw: dict[str, object] = {"need_weights": need_weights, "average_attn_weights": masks != "both"}
    if masks in ("padding", "both"):
        kw["key_padding_mask"] = padding
    if masks in ("attn", "both"):
        kw["attn_mask"] = attn
    on_device = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with torch.no_grad():
        expected = cpu(x, x, x, **kw)
        xd = x.to(DEVICE)
        with profile(use_device=DEVICE) as prof:
            actual = dev(xd, xd, xd, **on_device)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_native_multi_head_attention" in ops, sorted(ops)
    assert (FUSED in ops) == (not need_weights), sorted(ops)
    torch.testing.assert_close(actual[0].cpu(), expected[0], **F32)
    if need_weights:
        torch.testing.assert_close(actual[1].cpu(), expected[1], **F32)
    else:
        assert actual[1] is None and expected[1] is None


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_eval_fast_path_runs_on_the_device(
    norm_first: bool, activation: str, no_fallbacks: None
) -> None:
    def layer() -> torch.nn.TransformerEncoderLayer:
        torch.manual_seed(0)
        return torch.nn.TransformerEncoderLayer(
            32, 4, 64, activation=activation, norm_first=norm_first, batch_first=True
        ).eval()

    cpu, dev = layer(), layer().to(DEVICE)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(4))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 5:] = True
    src_mask = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1)
    with torch.no_grad():
        for kw in ({}, {"src_key_padding_mask": padding}, {"src_mask": src_mask, "src_key_padding_mask": padding}):
            on_device = {k: v.to(DEVICE) for k, v in kw.items()}
            with profile(use_device=DEVICE) as prof:
                actual = dev(x.to(DEVICE), **on_device)
            assert "aten::_transformer_encoder_layer_fwd" in {e.key for e in prof.key_averages()}
            torch.testing.assert_close(actual.cpu(), cpu(x, **kw), **F32)


def test_transformer_encoder_padding_needs_enable_nested_tensor_false(no_fallbacks: None) -> None:
    """In eval with a padding mask, nn.TransformerEncoder packs the batch into a nested tensor, which plugin
    devices lack: a clear error names the remedy, and without packing the stack matches the CPU's."""

    def encoder(nested: bool) -> torch.nn.TransformerEncoder:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()

    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(5))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    xd, pd = x.to(DEVICE), padding.to(DEVICE)
    with torch.no_grad():
        with pytest.raises(
            NotImplementedError,
            match=r"nested tensors are not supported on the 'sim' device.*enable_nested_tensor=False",
        ):
            encoder(True).to(DEVICE)(xd, src_key_padding_mask=pd)
        expected = encoder(False)(x, src_key_padding_mask=padding)
        actual = encoder(False).to(DEVICE)(xd, src_key_padding_mask=pd)
    torch.testing.assert_close(actual.cpu(), expected, **F32)

"""Plugin-defined operators and torch_fl.register_operator: kernels, autograd, fake tensors, errors."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fl

from .conftest import DEVICE, HANDLE, assert_close, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

_names = itertools.count()


def fresh(name: str) -> str:
    """A custom operator name no other test uses (operators live as long as the process)."""
    return f"tfl_test::{name}_{next(_names)}"


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(DEVICE).requires_grad_()


# --- the simulated plugin's fused operators ----------------------------------


def test_the_plugin_table_defines_and_routes_its_custom_operators() -> None:
    for op in ("fused_bias_gelu", "softmax_cross_entropy"):
        assert HANDLE.registrations[f"sim::{op}"] == "registered"
        assert HANDLE.registrations[f"sim::{op}_backward"] == "registered"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"sim::{op}", "Meta"), "infer_outputs became Meta"
    schema = str(torch.ops.sim.fused_bias_gelu.default._schema)
    assert schema == "sim::fused_bias_gelu(Tensor x, Tensor bias) -> Tensor"


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)])
def test_fused_bias_gelu_matches_aten_on_the_cpu(shape: tuple[int, ...]) -> None:
    x_cpu = torch.randn(*shape, requires_grad=True)
    b_cpu = torch.randn(16, requires_grad=True)
    x, b = leaf(x_cpu), leaf(b_cpu)
    grad = torch.randn(*shape)

    y = torch.ops.sim.fused_bias_gelu(x, b)
    expected = F.gelu(x_cpu + b_cpu)
    assert_close(y.detach(), expected.detach())
    y.backward(grad.to(DEVICE))
    expected.backward(grad)
    assert_close(x.grad, x_cpu.grad)
    assert_close(b.grad, b_cpu.grad)


def test_fused_bias_gelu_accepts_non_contiguous_inputs() -> None:
    x_cpu = torch.randn(16, 6).t()
    b_cpu = torch.randn(32)[::2]
    y = torch.ops.sim.fused_bias_gelu(x_cpu.to(DEVICE).t().contiguous().t(), b_cpu.to(DEVICE))
    assert_close(y, F.gelu(x_cpu + b_cpu))


def test_softmax_cross_entropy_matches_aten_with_probability_targets() -> None:
    logits_cpu = torch.randn(5, 7, requires_grad=True)
    target_cpu = torch.softmax(torch.randn(5, 7), dim=1).requires_grad_()
    logits, target = leaf(logits_cpu), leaf(target_cpu)

    loss = torch.ops.sim.softmax_cross_entropy(logits, target)
    expected = F.cross_entropy(logits_cpu, target_cpu)
    assert loss.shape == ()
    assert_close(loss.detach(), expected.detach())
    (loss * 3).backward()
    (expected * 3).backward()
    assert_close(logits.grad, logits_cpu.grad)
    assert_close(target.grad, target_cpu.grad)


def test_gradcheck_passes_on_the_device_in_float64() -> None:
    x = torch.randn(3, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.sim.fused_bias_gelu, (x, b))

    logits = torch.randn(4, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    target = torch.softmax(torch.randn(4, 6, dtype=torch.float64), 1).to(DEVICE).requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.sim.softmax_cross_entropy, (logits, target))


def test_infer_outputs_reports_bad_shapes_before_running() -> None:
    x, b = torch.randn(4, 8, device=DEVICE), torch.randn(7, device=DEVICE)
    with pytest.raises(RuntimeError, match="fused_bias_gelu"):
        torch.ops.sim.fused_bias_gelu(x, b)


def test_fake_tensors_get_shapes_from_the_plugin() -> None:
    real_x, real_b = torch.empty(2, 3, 8, device=DEVICE), torch.empty(8, device=DEVICE)
    with FakeTensorMode() as mode:
        x, b = mode.from_tensor(real_x), mode.from_tensor(real_b)
        y = torch.ops.sim.fused_bias_gelu(x, b)
        gx, gb = torch.ops.sim.fused_bias_gelu_backward(y, x, b)
        loss = torch.ops.sim.softmax_cross_entropy(x[0], x[1])
    assert (y.shape, y.dtype, y.device.type) == ((2, 3, 8), torch.float32, DEVICE)
    assert (gx.shape, gb.shape, loss.shape) == ((2, 3, 8), (8,), ())


def test_compiled_model_with_a_fused_operator_matches_eager() -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 16, device=DEVICE, requires_grad=True)
    b = torch.randn(16, device=DEVICE, requires_grad=True)
    x = torch.randn(4, 8, device=DEVICE)

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.sim.fused_bias_gelu(x @ w, b).sum()

    mlp(x).backward()
    eager = (w.grad.cpu().clone(), b.grad.cpu().clone())
    w.grad = b.grad = None
    torch.compile(mlp, backend="aot_eager", fullgraph=True)(x).backward()
    torch.testing.assert_close(w.grad.cpu(), eager[0])
    torch.testing.assert_close(b.grad.cpu(), eager[1])


# --- register_operator --------------------------------------------------------


def test_python_operator_with_python_backward_supports_gradgradcheck() -> None:
    name = fresh("cube")
    handle = torch_fl.register_operator(
        name,
        lambda x, k: x**3 * k,
        lambda grad, x, k: grad * 3 * x**2 * k,
        schema=f"{name.split('::')[1]}(Tensor x, float k) -> Tensor",
    )
    x = torch.randn(4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: handle(t, 2.0), (x,))
    assert torch.autograd.gradgradcheck(lambda t: handle(t, 2.0), (x,))
    assert handle.fake == "the Python forward, on meta tensors"


def test_plugin_kernel_by_symbol_under_a_new_name() -> None:
    name = fresh("bias_gelu")
    short = name.split("::")[1]
    handle = torch_fl.register_operator(
        name,
        "torch_fl_op_sim__fused_bias_gelu",
        backward_func="sim::fused_bias_gelu_backward",
        schema=f"{short}(Tensor x, Tensor bias) -> Tensor",
    )
    x_cpu, b_cpu = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    x, b = leaf(x_cpu), leaf(b_cpu)
    handle(x, b).sum().backward()
    F.gelu(x_cpu + b_cpu).sum().backward()
    assert_close(x.grad, x_cpu.grad)
    assert_close(b.grad, b_cpu.grad)
    assert "torch_fl_op_sim__fused_bias_gelu" in handle.forward
    assert handle.fake == "the plugin's infer_outputs"


def test_a_kernel_without_shape_function_needs_a_fake_implementation() -> None:
    name = fresh("relu")
    short = name.split("::")[1]
    torch_fl.register_operator(name, "torch_fl_op_relu", schema=f"{short}(Tensor self) -> Tensor")
    x = torch.randn(5, device=DEVICE)
    op = getattr(torch.ops.tfl_test, short)
    with pytest.raises(NotImplementedError, match="register_fake"):
        op(x)

    name = fresh("relu")
    short = name.split("::")[1]
    handle = torch_fl.register_operator(
        name, "torch_fl_op_relu", schema=f"{short}(Tensor self) -> Tensor", fake_func=torch.empty_like
    )
    assert_close(handle(x), torch.relu(x.cpu()))


def test_a_plugin_backward_symbol_is_defined_with_the_conventional_schema() -> None:
    name = fresh("tanh")
    short = name.split("::")[1]
    handle = torch_fl.register_operator(
        name,
        "torch_fl_op_tanh",
        backward_func="torch_fl_op_tanh_backward",  # aten's (grad_output, output): only the schema is checked here
        schema=f"{short}(Tensor self) -> Tensor",
        fake_func=torch.empty_like,
    )
    backward = getattr(torch.ops.tfl_test, f"{short}_backward").default
    assert str(backward._schema) == f"tfl_test::{short}_backward(Tensor grad_0, Tensor self) -> Tensor"
    assert handle.backward is not None and "torch_fl_op_tanh_backward" in handle.backward

    # A backward kernel that does not fit the convention is refused.
    name = fresh("tanh")
    with pytest.raises(torch_fl.OperatorArityError, match="backward kernel 'torch_fl_op_addcmul'"):
        torch_fl.register_operator(
            name,
            "torch_fl_op_tanh",
            backward_func="torch_fl_op_addcmul",
            schema=f"{name.split('::')[1]}(Tensor self) -> Tensor",
        )


# --- registration errors ------------------------------------------------------


def test_registering_an_operator_twice_is_refused() -> None:
    name = fresh("twice")
    schema = f"{name.split('::')[1]}(Tensor x) -> Tensor"
    torch_fl.register_operator(name, torch.sin, schema=schema)
    with pytest.raises(torch_fl.DuplicateOperatorError, match="already registered"):
        torch_fl.register_operator(name, torch.sin, schema=schema)
    with pytest.raises(torch_fl.DuplicateOperatorError, match="already"):
        torch_fl.register_operator(
            "sim::fused_bias_gelu", "sim::fused_bias_gelu", schema="fused_bias_gelu(Tensor x, Tensor bias) -> Tensor"
        )


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ("op(Tensor x -> Tensor", "does not parse"),
        ("op(Tensor x) -> Tensor", "names tfl_test::op"),
        (None, "needs a schema"),
    ],
)
def test_bad_schemas_are_refused(schema: str | None, match: str) -> None:
    with pytest.raises(torch_fl.OperatorSchemaError, match=match):
        torch_fl.register_operator(fresh("schema"), torch.sin, schema=schema)


def test_a_missing_kernel_symbol_is_refused() -> None:
    name = fresh("missing")
    with pytest.raises(torch_fl.KernelSymbolError, match="torch_fl_op_does_not_exist"):
        torch_fl.register_operator(
            name, "torch_fl_op_does_not_exist", schema=f"{name.split('::')[1]}(Tensor x) -> Tensor"
        )
    assert torch._C._dispatch_has_kernel_for_dispatch_key("sim::fused_bias_gelu", "PrivateUse1")


def test_arity_mismatches_are_refused() -> None:
    name = fresh("arity")
    short = name.split("::")[1]
    with pytest.raises(torch_fl.OperatorArityError, match="2 arguments"):
        torch_fl.register_operator(name, "sim::fused_bias_gelu", schema=f"{short}(Tensor x) -> Tensor")
    with pytest.raises(torch_fl.OperatorArityError, match="forward"):
        torch_fl.register_operator(name, lambda x, y: x, schema=f"{short}(Tensor x) -> Tensor")
    with pytest.raises(torch_fl.OperatorArityError, match="backward"):
        torch_fl.register_operator(
            name, torch.sin, backward_func=lambda grad: grad, schema=f"{short}(Tensor x) -> Tensor"
        )
    with pytest.raises(torch_fl.OperatorArityError, match="gradient"):
        torch_fl.register_operator(
            name,
            "sim::fused_bias_gelu",
            backward_func="sim::softmax_cross_entropy",
            schema=f"{short}(Tensor x, Tensor bias) -> Tensor",
        )
    # Nothing was left half-registered.
    assert not hasattr(torch.ops.tfl_test, short)


def test_unknown_aten_operators_are_refused() -> None:
    with pytest.raises(torch_fl.OperatorNotFoundError, match="no operator aten::fused_gelu"):
        torch_fl.register_operator("aten::fused_gelu", "gelu")


def test_errors_share_the_torch_fl_base_class() -> None:
    for cls in (
        torch_fl.DuplicateOperatorError,
        torch_fl.OperatorSchemaError,
        torch_fl.OperatorArityError,
    ):
        assert issubclass(cls, torch_fl.OperatorRegistrationError)
        assert issubclass(cls, torch_fl.TorchFLError)


def test_aten_backward_override_applies_to_the_device_only() -> None:
    out = assert_ok(
        run_python(
            f"""
            import torch, torch_fl
            torch_fl.register_device_plugin(name="{DEVICE}")
            handle = torch_fl.register_operator("aten::sign", "sign", backward_func=lambda grad, x: grad * 2)
            x = torch.randn(4, device="{DEVICE}", requires_grad=True)
            x.sign().sum().backward()
            assert torch.equal(x.grad.cpu(), torch.full((4,), 2.0)), x.grad
            c = x.detach().cpu().requires_grad_()
            c.sign().sum().backward()
            assert torch.equal(c.grad, torch.zeros(4)), c.grad
            print(handle.name, "|", handle.backward)
            """
        )
    )
    assert out.startswith("aten::sign | Python function")


def test_a_fake_function_takes_precedence_over_the_plugins_infer_outputs() -> None:
    name = fresh("gelu_fake")
    calls = []

    def fake(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape)
        return torch.empty_like(x)

    handle = torch_fl.register_operator(
        name, "sim::fused_bias_gelu", schema=f"{name.split('::')[1]}(Tensor x, Tensor bias) -> Tensor", fake_func=fake
    )
    assert handle.fake is not None and "fake" in handle.fake
    x, b = torch.randn(2, 4), torch.randn(4)
    assert_close(handle(x.to(DEVICE), b.to(DEVICE)), F.gelu(x + b))
    assert calls == [(2, 4)], "output shapes came from the Python fake"

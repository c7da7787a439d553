"""The OpenCL plugin (crates/torchfl-opencl) as a PyTorch device: its runtime and elementwise kernels.

Its memory is OpenCL buffers, which the host cannot address: tensors live
behind the plugin's device addresses (docs/plugin-abi.md, "Handle-based
memory"), operators in its table run as OpenCL C kernels, and every other
operator runs on the CPU through copies. The device is called "ocl", as in
pytorch_dlprim: "opencl" is one of PyTorch's own device types (a legacy
one, with no backend), so it cannot name a PrivateUse1 device. The operator
families beyond the elementwise ones are in test_opencl_kernels.py, whole
models in test_opencl_models.py, the plugin package in
test_opencl_package.py; what they share in _opencl.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ._opencl import NEEDS_OPENCL, PLUGIN, run
from .conftest import assert_ok, run_python

pytestmark = NEEDS_OPENCL


def test_arithmetic_runs_in_opencl_kernels_and_matches_the_cpu() -> None:
    out = run(
        """
torch.manual_seed(0)
a, b = torch.randn(3, 4), torch.randn(4)
i, j = torch.arange(12).reshape(3, 4), torch.arange(4)
torch_fl.reset_fallback_stats()
da, db, di, dj = a.to("ocl"), b.to("ocl"), i.to("ocl"), j.to("ocl")
cases = {
    "add": (da + db, a + b),
    "sub alpha": (torch.sub(da, db, alpha=2.0), torch.sub(a, b, alpha=2.0)),
    "mul": (da * db, a * b),
    "div": (da / db, a / b),
    "strided + number": (da.t() + 1.5, a.t() + 1.5),
    "int64": (di * dj + di, i * j + i),
    "int64 / int64": (di / (dj + 1), i / (j + 1)),
    "empty": (da[3:] + db, a[3:] + b),
}
for name, (got, want) in cases.items():
    assert got.device.type == "ocl", name
    torch.testing.assert_close(got.cpu(), want, msg=name)
kernels = {op.split(".")[0] for op in torch_fl.fallback_stats()}
assert not kernels & {"add", "sub", "mul", "div"}, torch_fl.fallback_stats()
print("ok", handle.name)
"""
    )
    assert out.strip() == "ok ocl"  # the plugin names itself after its device


def test_unary_in_place_copy_and_fill_kernels_match_the_cpu() -> None:
    out = run(
        """
torch.manual_seed(0)
x = torch.randn(5, 6)
torch_fl.reset_fallback_stats()
d = x.to("ocl")
for name in ["relu", "neg", "abs", "exp", "sigmoid", "tanh", "sin", "cos"]:
    torch.testing.assert_close(getattr(torch, name)(d).cpu(), getattr(torch, name)(x), msg=name)
pos = x.abs() + 0.5
for name in ["log", "sqrt", "rsqrt"]:
    torch.testing.assert_close(getattr(torch, name)(pos.to("ocl")).cpu(), getattr(torch, name)(pos), msg=name)
# In place, on a strided view: only the view's elements change.
y, dy = x.clone(), x.to("ocl")
y[:, ::2].add_(1.0, alpha=3.0).relu_()
dy[:, ::2].add_(1.0, alpha=3.0).relu_()
torch.testing.assert_close(dy.cpu(), y)
# copy_: converting, broadcasting and strided, on the device.
target = torch.zeros(6, 5, device="ocl")
target.t().copy_(torch.arange(6).to("ocl"))
torch.testing.assert_close(target.cpu(), torch.arange(6.0).expand(5, 6).t())
filled = torch.empty(3, 3, device="ocl").fill_(2.5)
torch.testing.assert_close(filled.cpu(), torch.full((3, 3), 2.5))
print(sorted(torch_fl.fallback_stats()))
"""
    )
    assert out.strip() == "[]", f"operators fell back to the CPU: {out}"


def test_matrix_products_match_the_cpu_on_transposed_and_broadcast_operands() -> None:
    out = run(
        """
import copy
torch.manual_seed(0)
a, b = torch.randn(37, 19), torch.randn(19, 23)
x, y = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
bias = torch.randn(23)
torch_fl.reset_fallback_stats()
da, db = a.to("ocl"), b.to("ocl")
torch.testing.assert_close((da @ db).cpu(), a @ b, msg="mm")
torch.testing.assert_close((db.t() @ da.t()).cpu(), b.t() @ a.t(), msg="mm of transposed views")
torch.testing.assert_close(torch.bmm(x.to("ocl"), y.to("ocl")).cpu(), torch.bmm(x, y), msg="bmm")
got = torch.addmm(bias.to("ocl"), da, db, beta=0.5, alpha=2.0)
torch.testing.assert_close(got.cpu(), torch.addmm(bias, a, b, beta=0.5, alpha=2.0), msg="addmm")
assert not torch_fl.fallback_stats(), torch_fl.fallback_stats()
# A linear layer trains on the device alone: forward on addmm, backward on
# mm and the bias gradient's sum.
lin = torch.nn.Linear(19, 23)
dlin = copy.deepcopy(lin).to("ocl")
lin(a).square().mean().backward()
dlin(da).square().mean().backward()
for (name, p), dp in zip(lin.named_parameters(), dlin.parameters()):
    torch.testing.assert_close(dp.grad.cpu(), p.grad, msg=name)
assert not torch_fl.fallback_stats(), torch_fl.fallback_stats()
print("ok")
"""
    )
    assert out.strip() == "ok"


def test_pointwise_comparison_positional_and_bool_kernels_match_the_cpu() -> None:
    out = run(
        """
import torch.nn.functional as F
torch.manual_seed(0)
a, b, c = torch.randn(3, 4), torch.randn(4), torch.rand(3, 1) + 0.5
i = torch.arange(12).reshape(3, 4)
d = lambda t: t.to("ocl")
aten = torch.ops.aten
torch_fl.reset_fallback_stats()
cases = {
    "gelu": (F.gelu(d(a)), F.gelu(a)),
    "gelu tanh": (F.gelu(d(a), approximate="tanh"), F.gelu(a, approximate="tanh")),
    "gelu_backward": (aten.gelu_backward(d(b).expand(3, 4), d(a)), aten.gelu_backward(b.expand(3, 4), a)),
    "gelu_backward tanh": (
        aten.gelu_backward(d(b).expand(3, 4), d(a), approximate="tanh"),
        aten.gelu_backward(b.expand(3, 4), a, approximate="tanh"),
    ),
    "threshold_backward": (aten.threshold_backward(d(a), d(b), 0.0), aten.threshold_backward(a, b, 0.0)),
    "addcmul": (torch.addcmul(d(a), d(b), d(c), value=0.5), torch.addcmul(a, b, c, value=0.5)),
    "addcdiv": (torch.addcdiv(d(a), d(b), d(c), value=-2), torch.addcdiv(a, b, c, value=-2)),
    "lerp small weight": (torch.lerp(d(a), d(b), 0.3), torch.lerp(a, b, 0.3)),
    "lerp large weight": (torch.lerp(d(a), d(b), 0.7), torch.lerp(a, b, 0.7)),
    "lerp tensor weight": (torch.lerp(d(a), d(b), d(c)), torch.lerp(a, b, c)),
    "masked_fill": (d(a).masked_fill(d(b) > 0, -1.5), a.masked_fill(b > 0, -1.5)),
    "masked_fill tensor": (d(a).masked_fill(d(b) > 0, d(torch.tensor(2.0))), a.masked_fill(b > 0, torch.tensor(2.0))),
    "where": (torch.where(d(b) > 0, d(a), d(c)), torch.where(b > 0, a, c)),
    "bitwise_not bool": (~(d(b) > 0), ~(b > 0)),
    "bitwise_not int64": (~d(i), ~i),
    "bool ones": (torch.ones(3, dtype=torch.bool, device="ocl"), torch.ones(3, dtype=torch.bool)),
    "float to bool": (d(torch.tensor([0.0, 0.5, -2.0])).bool(), torch.tensor([0.0, 0.5, -2.0]).bool()),
    "bool to float": (d(torch.tensor([True, False])).float(), torch.tensor([True, False]).float()),
    "2 * t": (2 * d(a), 2 * a),
    "1 - t": (1 - d(a), 1 - a),
    "3 / t": (3 / d(a), 3 / a),
    "mul.Scalar": (aten.mul.Scalar(d(a), 2), a * 2),
    "add.Scalar alpha": (aten.add.Scalar(d(a), 2, 3), a + 6),
    "square": (d(a).square(), a.square()),
    "pow 3": (d(a) ** 3, a**3),
    "pow -0.5": (d(c) ** -0.5, c**-0.5),
    "tril": (torch.tril(d(a)), torch.tril(a)),
    "triu of a transposed view": (torch.triu(d(a).t(), 1), torch.triu(a.t(), 1)),
    "tril bool": (torch.ones(4, 4, dtype=torch.bool, device="ocl").tril(), torch.ones(4, 4, dtype=torch.bool).tril()),
    "arange": (torch.arange(7, device="ocl"), torch.arange(7)),
    "arange float": (torch.arange(0.5, 3.0, 0.25, device="ocl"), torch.arange(0.5, 3.0, 0.25)),
    "arange negative step": (torch.arange(10, 1, -3, device="ocl"), torch.arange(10, 1, -3)),
}
for name in ["eq", "ne", "lt", "le", "gt", "ge"]:
    f = getattr(torch, name)
    cases[name] = (f(d(a), d(b)), f(a, b))
    cases[name + " number"] = (f(d(a), 0.1), f(a, 0.1))
    cases[name + " int64 with a float number"] = (f(d(i), 5.5), f(i, 5.5))
for name, (got, want) in cases.items():
    assert got.device.type == "ocl", name
    torch.testing.assert_close(got.cpu(), want, msg=name)
print(sorted(torch_fl.fallback_stats()))
"""
    )
    assert out.strip() == "[]", f"operators fell back to the CPU: {out}"


def test_out_fallback_through_copies_never_triggers_the_deprecated_resize_warning() -> None:
    out = run(
        """
import warnings
a, b = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
da = a.detach().to("ocl").requires_grad_()
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    loss = torch.nn.functional.mse_loss(da, b.to("ocl"))
    loss.backward()
assert not [w for w in record if "was resized" in str(w.message)], [str(w.message) for w in record]
assert "mse_loss.out" in torch_fl.fallback_stats(), torch_fl.fallback_stats()
want = torch.nn.functional.mse_loss(a, b)
want.backward()
torch.testing.assert_close(loss.cpu(), want.detach())
torch.testing.assert_close(da.grad.cpu(), a.grad)
print("ok")
"""
    )
    assert out.strip() == "ok"


def test_operators_outside_its_table_run_on_the_cpu_through_copies() -> None:
    out = run(
        """
import warnings
x = torch.linspace(-2, 2, 9)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the once-per-operator fallback warning
    y = torch.erf(x.to("ocl"))
assert y.device.type == "ocl"
torch.testing.assert_close(y.cpu(), torch.erf(x))
assert any(op.startswith("erf") for op in torch_fl.fallback_stats()), torch_fl.fallback_stats()
print("ok")
"""
    )
    assert out.strip() == "ok"


def test_fallback_error_mode_names_the_operator() -> None:
    out = run(
        """
x = torch.ones(4).to("ocl")
try:
    torch.erf(x)
except Exception as e:
    print(type(e).__name__, "|", e)
""",
        TORCH_FL_FALLBACK="error",
    )
    assert "erf" in out and "ocl" in out, out


def test_a_missing_driver_is_an_error_that_says_what_to_install(tmp_path) -> None:
    result = run_python(
        f"""
import torch_fl
try:
    torch_fl.register_device_plugin(name="ocl", plugin_path={str(PLUGIN)!r})
except torch_fl.TorchFLError as e:
    print(type(e).__name__, "|", e)
""",
        env={"TORCH_FL_OPENCL_LIBRARY": str(tmp_path / "libOpenCL-missing.so")},
    )
    out = assert_ok(result)
    assert "no OpenCL driver" in out and "pocl-opencl-icd" in out, out


@pytest.mark.timeout(600)
def test_compat_gives_a_clean_report_with_opinfo_conformance_of_its_whole_table() -> None:
    """``python -m torch_fl compat --device ocl``: every operator of the table against PyTorch's OpInfo samples."""
    command = [sys.executable, "-m", "torch_fl", "compat", "--device", "ocl", "--plugin", str(PLUGIN)]
    result = subprocess.run(
        [*command, "--dtypes", "float32,int64", "--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] and report["summary"]["samples_failed"] == 0, report["summary"]
    status = {op["name"]: op["status"] for op in report["ops"]}
    # Each operator of the table is checked; the few without an OpInfo
    # sample that reaches them are in-place or internal forms whose
    # functional twins are checked.
    no_samples = {name for name, s in status.items() if s == "no_samples"}
    assert set(status.values()) <= {"passed", "no_samples"}, status
    assert len(status) > 90 and len(no_samples) <= 6, no_samples
    models = {m["model"].split(" (")[0]: m for m in report["coverage"]["models"]}
    for name in ("resnet18", "GPT", "LSTM"):
        assert models[name]["coverage_percent"] == 100.0 and not models[name]["fallback"], models[name]
    checks = {c["id"]: c["status"] for c in report["integrity"]["checks"]}
    # Collectives and native graphs are optional, and the OpenCL plugin has neither.
    assert {s for i, s in checks.items() if i not in ("collectives", "graphs")} == {"pass"}, checks
    assert checks["graphs"] == "skip", checks


def test_the_trace_shows_its_native_opencl_calls_builds_and_device_times() -> None:
    out = run(
        """
a = torch.randn(256).to("ocl")
with torch_fl.trace() as t:
    b = (a + a).relu()
    torch.accelerator.synchronize()
add = next(e for e in t.events if e.name == "add.Tensor")
names = {(r.kind, r.name) for r in add.native}
assert ("api", "clEnqueueNDRangeKernel") in names, names
assert ("build", "clBuildProgram") in names, names  # the first add in the process builds its program
work = [r for r in add.native if r.kind == "kernel"]
assert work and not work[0].host_clock and "add.Tensor" in work[0].detail, work
assert add.device_begin_ns == work[0].begin_ns and add.device_end_ns >= add.device_begin_ns
assert any(r.kind == "sync" and r.name == "clFinish" for r in t.native), t.native
print("native", " ".join(sorted({r.kind for r in t.native})))
print(t.native_report())
"""
    )
    assert out.startswith("native "), out
    assert "clEnqueueNDRangeKernel" in out

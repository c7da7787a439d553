"""The OpenCL plugin (crates/torchfl-opencl) as a PyTorch device.

Its memory is OpenCL buffers, which the host cannot address: tensors live
behind the plugin's device addresses (docs/plugin-abi.md, "Handle-based
memory"), operators in its table run as OpenCL C kernels, and every other
operator runs on the CPU through copies. The device is called "ocl", as in
pytorch_dlprim: "opencl" is one of PyTorch's own device types (a legacy
one, with no backend), so it cannot name a PrivateUse1 device. Each test runs in a fresh
interpreter, since this one registered the simulator in the process' one
device slot.

They need an OpenCL driver; `make test` installs PoCL (OpenCL on the CPU)
when it runs as root, as CI does. Elsewhere they skip, saying what to
install.
"""

from __future__ import annotations

import ctypes
import glob

import pytest

from .conftest import ROOT, assert_ok, run_python

PLUGIN = ROOT / "target" / "release" / "libtorchfl_opencl.so"


def _why_not() -> str | None:
    if not PLUGIN.exists():
        return f"{PLUGIN} is not built (`make install` builds it)"
    if not glob.glob("/etc/OpenCL/vendors/*.icd"):
        return "no OpenCL driver: apt install ocl-icd-libopencl1 pocl-opencl-icd (`make test` does, as root)"
    try:
        ctypes.CDLL("libOpenCL.so.1")
    except OSError as e:
        return f"the OpenCL loader does not open ({e}): apt install ocl-icd-libopencl1"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

PRELUDE = f"""
import torch, torch_fl
handle = torch_fl.register_device_plugin(name="ocl", plugin_path={str(PLUGIN)!r})
"""


def run(code: str, **env: str) -> str:
    return assert_ok(run_python(PRELUDE + code, env=env, timeout=240))


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
    assert out.strip() == "ok opencl"  # the plugin's own name; the device is "ocl"


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
import copy, warnings
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
# A linear layer trains: forward on addmm, backward on mm (the bias
# gradient's sum falls back to the CPU for now).
lin = torch.nn.Linear(19, 23)
dlin = copy.deepcopy(lin).to("ocl")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    lin(a).square().mean().backward()
    dlin(da).square().mean().backward()
for (name, p), dp in zip(lin.named_parameters(), dlin.parameters()):
    torch.testing.assert_close(dp.grad.cpu(), p.grad, msg=name)
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


def test_reductions_match_the_cpu_on_strided_inputs_without_falling_back() -> None:
    out = run(
        """
torch.manual_seed(0)
x, y = torch.randn(4, 5, 6), torch.randn(6, 7, 8)
y[1, 2, 3] = y[1, 2, 5] = 100.0  # a tie: the first index wins
i = torch.randint(-100, 100, (7, 9))
big, wide = torch.randn(300001), torch.randn(3, 70000)
nan = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [1.0, 2.0, 2.0, 0.0]])
positive = x > 0
torch_fl.reset_fallback_stats()
dx, dy, di, dnan = x.to("ocl"), y.to("ocl"), i.to("ocl"), nan.to("ocl")
cases = {
    "sum": (dx.sum(), x.sum()),
    "sum dims keepdim": (dx.sum((0, 2), keepdim=True), x.sum((0, 2), keepdim=True)),
    "sum of a transposed view": (dx.transpose(0, 2).sum(1), x.transpose(0, 2).sum(1)),
    "sum of a broadcast view": (dx[:, None].expand(4, 3, 5, 6).sum((0, 1)), x[:, None].expand(4, 3, 5, 6).sum((0, 1))),
    "sum of nothing": (dx[:, :0].sum(1), x[:, :0].sum(1)),
    "mean": (dx.mean((0, -1)), x.mean((0, -1))),
    "mean of a slice, keepdim": (dx[:, ::2].mean(-1, keepdim=True), x[:, ::2].mean(-1, keepdim=True)),
    "int64 sum": (di.sum(0), i.sum(0)),
    "bool sum": (positive.to("ocl").sum(), positive.sum()),
    "sum to float32": (di.sum(dtype=torch.float32), i.sum(dtype=torch.float32)),
    "large mean along a dim": (wide.to("ocl").mean(1), wide.mean(1)),
    "large sum of a transposed view": (wide.t().to("ocl").sum(0), wide.t().sum(0)),
    "argmax": (dy.argmax(), y.argmax()),
    "argmax keepdim": (dy.argmax(keepdim=True), y.argmax(keepdim=True)),
    "argmax dim": (dy.argmax(2), y.argmax(2)),
    "argmin of a transposed view": (dy.transpose(0, 2).argmin(-1), y.transpose(0, 2).argmin(-1)),
    "argmax int64": (di.argmax(1), i.argmax(1)),
    "large argmax": (big.to("ocl").argmax(), big.argmax()),
    "max.dim": (dy.max(2), y.max(2)),
    "min.dim keepdim": (dy.min(1, keepdim=True), y.min(1, keepdim=True)),
    "max.dim with NaN": (dnan.max(1), nan.max(1)),
    "amax": (dy.amax((0, 2)), y.amax((0, 2))),
    "amin": (dy.amin(), y.amin()),
    "max": (dy.max(), y.max()),
    "min int64": (di.min(), i.min()),
}
for name, (got, want) in cases.items():
    got, want = (tuple(got), tuple(want)) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.device.type == "ocl", name
        torch.testing.assert_close(g.cpu(), w, equal_nan=True, msg=name)
# 3e5 float32 terms: within a few float32 roundings of the exact sum.
torch.testing.assert_close(big.to("ocl").sum().cpu().double(), big.double().sum(), rtol=0, atol=1e-3)
try:
    dx[:, :0].max(1)
except RuntimeError as e:
    assert "non-zero size" in str(e), e
else:
    raise AssertionError("max over an empty dimension did not fail")
print(sorted(torch_fl.fallback_stats()))
"""
    )
    assert out.strip() == "[]", f"operators fell back to the CPU: {out}"


def test_softmax_forward_and_backward_match_float64_along_any_dim() -> None:
    out = run(
        """
import torch.nn.functional as F
torch.manual_seed(0)
torch_fl.reset_fallback_stats()
# Compared with float64 on the CPU: the CPU's own float32 sums along a
# long non-last dimension are the less accurate ones.
for shape, dim in [((4, 7), -1), ((4, 7), 0), ((3, 5, 6), 1), ((2, 300), -1), ((5000, 3), 0), ((), 0), ((3, 0), 1)]:
    for fn in (F.softmax, F.log_softmax):
        x = torch.randn(shape[::-1]).t() * 5 if len(shape) == 2 else torch.randn(shape) * 5  # transposed views
        x64 = x.double().requires_grad_()
        dx = x.to("ocl").requires_grad_()
        y, dy = fn(x64, dim=dim), fn(dx, dim=dim)
        name = f"{fn.__name__} {shape} dim {dim}"
        torch.testing.assert_close(dy.detach().cpu(), y.detach().float(), msg=name)
        g = torch.randn(shape)
        y.backward(g.double())
        dy.backward(g.to("ocl"))
        torch.testing.assert_close(dx.grad.cpu(), x64.grad.float(), msg=name + " backward")
x = torch.tensor([[1000.0, 0.0, -1000.0], [float("-inf"), 0.0, 1.0]])
for fn in (torch.softmax, torch.log_softmax):
    torch.testing.assert_close(fn(x.to("ocl"), 1).cpu(), fn(x, 1), msg=f"{fn.__name__} of extremes")
print(sorted(torch_fl.fallback_stats()))
"""
    )
    assert out.strip() == "[]", f"operators fell back to the CPU: {out}"


def test_cross_entropy_forward_and_backward_match_the_cpu() -> None:
    out = run(
        """
import torch.nn.functional as F
torch.manual_seed(0)
torch_fl.reset_fallback_stats()
options = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"ignore_index": 2},
    {"weight": torch.rand(5) + 0.1},
    {"weight": torch.rand(5) + 0.1, "ignore_index": 1},
    {"weight": torch.rand(5), "reduction": "sum"},
    {"weight": torch.rand(5), "reduction": "none", "ignore_index": 0},
]
for n in (8, 300):
    for kw in options:
        logits = torch.randn(5, n).t().requires_grad_()  # a transposed view
        target = torch.randint(0, 5, (n,))
        target[::3] = 2
        dlogits = logits.detach().to("ocl").requires_grad_()
        dkw = {k: v.to("ocl") if torch.is_tensor(v) else v for k, v in kw.items()}
        loss, dloss = F.cross_entropy(logits, target, **kw), F.cross_entropy(dlogits, target.to("ocl"), **dkw)
        name = f"{n} {kw}"
        torch.testing.assert_close(dloss.cpu(), loss.detach(), msg=name)
        g = torch.randn(loss.shape)
        loss.backward(g)
        dloss.backward(g.to("ocl"))
        torch.testing.assert_close(dlogits.grad.cpu(), logits.grad, msg=name + " backward")
# One unbatched sample, and every target ignored (NaN, as on the CPU).
logits = torch.randn(7, requires_grad=True)
dlogits = logits.detach().to("ocl").requires_grad_()
F.cross_entropy(logits, torch.tensor(3)).backward()
dloss = F.cross_entropy(dlogits, torch.tensor(3).to("ocl"))
dloss.backward()
torch.testing.assert_close(dlogits.grad.cpu(), logits.grad)
assert F.cross_entropy(torch.randn(3, 4).to("ocl"), torch.full((3,), -100).to("ocl")).cpu().isnan()
# Spatial (nll_loss2d).
x, t, w = torch.randn(2, 4, 3, 5, requires_grad=True), torch.randint(0, 4, (2, 3, 5)), torch.rand(4)
dx = x.detach().to("ocl").requires_grad_()
F.cross_entropy(x, t, weight=w, ignore_index=1).backward()
dloss = F.cross_entropy(dx, t.to("ocl"), weight=w.to("ocl"), ignore_index=1)
dloss.backward()
torch.testing.assert_close(dloss.cpu(), F.cross_entropy(x, t, weight=w, ignore_index=1).detach())
torch.testing.assert_close(dx.grad.cpu(), x.grad)
print(sorted(torch_fl.fallback_stats()))
"""
    )
    assert out.strip() == "[]", f"operators fell back to the CPU: {out}"

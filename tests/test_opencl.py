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


def test_pooling_forward_and_backward_match_the_cpu() -> None:
    out = run(
        """
import warnings
warnings.simplefilter("ignore")
F = torch.nn.functional
torch.manual_seed(0)
torch_fl.reset_fallback_stats()
def check(name, fn, x):
    xc, xd = x.clone().requires_grad_(), x.to("ocl").requires_grad_()
    yc, yd = fn(xc), fn(xd)
    torch.testing.assert_close(yd.cpu(), yc, equal_nan=True, msg=name)
    g = torch.randn_like(yc)
    yc.backward(g)
    yd.backward(g.to("ocl"))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, equal_nan=True, msg=name + " backward")
x = torch.randn(2, 3, 9, 10)
nan = x.clone()
nan[0, 0, 1, 1], nan[1, 2, 4:6, 4:6] = float("nan"), float("-inf")
cases = {
    "max resnet stem": (lambda t: F.max_pool2d(t, 3, 2, 1), x),
    "max ceil_mode": (lambda t: F.max_pool2d(t, 3, 2, 0, ceil_mode=True), x),
    "max dilation": (lambda t: F.max_pool2d(t, (3, 2), (2, 1), 1, dilation=(2, 3), ceil_mode=True), x),
    "max unbatched": (lambda t: F.max_pool2d(t, 2), x[0]),
    "max strided": (lambda t: F.max_pool2d(t.transpose(2, 3), 3, 2, 1), x),
    "max ties": (lambda t: F.max_pool2d(t, 3, 1, 1), torch.ones(1, 2, 5, 5)),
    "max nan": (lambda t: F.max_pool2d(t, 3, 2, 1), nan),
    "avg": (lambda t: F.avg_pool2d(t, 3, 2, 1), x),
    "avg excluding pad": (lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False), x),
    "avg ceil_mode": (lambda t: F.avg_pool2d(t, 2, 3, 1, ceil_mode=True), x),
    "avg divisor": (lambda t: F.avg_pool2d(t, (3, 2), (1, 2), (1, 0), divisor_override=5), x),
    "avg unbatched": (lambda t: F.avg_pool2d(t, 2), x[1]),
    "adaptive": (lambda t: F.adaptive_avg_pool2d(t, (4, 3)), x),
    "adaptive growing": (lambda t: F.adaptive_avg_pool2d(t, (7, 13)), x),
    "adaptive strided": (lambda t: F.adaptive_avg_pool2d(t.transpose(1, 2), (5, 2)), x[0]),
    "adaptive resnet head": (lambda t: F.adaptive_avg_pool2d(t, (1, 2)), torch.randn(2, 8, 2, 2)),
}
for name, (fn, t) in cases.items():
    check(name, fn, t)
_, got = F.max_pool2d(nan.to("ocl"), 3, 2, 1, return_indices=True)
assert torch.equal(got.cpu(), F.max_pool2d(nan, 3, 2, 1, return_indices=True)[1])
empty = torch.randn(0, 3, 8, 8)
torch.testing.assert_close(F.max_pool2d(empty.to("ocl"), 2).cpu(), F.max_pool2d(empty, 2))
torch.testing.assert_close(F.avg_pool2d(empty.to("ocl"), 2).cpu(), F.avg_pool2d(empty, 2))
ops = {"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
       "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"}
print(sorted(set(torch_fl.fallback_stats()) & ops))
"""
    )
    assert out.strip() == "[]", f"pooling fell back to the CPU: {out}"


def test_index_select_embedding_and_cat_match_the_cpu() -> None:
    out = run(
        """
torch.manual_seed(0)
torch_fl.reset_fallback_stats()
D = "ocl"
def same(got, want, msg):
    assert got.device.type == D, msg
    torch.testing.assert_close(got.cpu(), want, msg=msg)
x, idx = torch.randn(4, 5, 6), torch.tensor([3, 0, 0, 2])
for dim in [0, 1, 2, -1]:
    same(x.to(D).index_select(dim, idx.to(D)), x.index_select(dim, idx), f"index_select dim {dim}")
xt = x.transpose(0, 2)
same(x.to(D).transpose(0, 2).index_select(1, idx.to(D)[::2]), xt.index_select(1, idx[::2]), "strided")
ints, flags = torch.arange(30).reshape(5, 6), torch.rand(5, 6) > 0.5
same(ints.to(D).index_select(1, idx.to(D)), ints.index_select(1, idx), "int64")
same(flags.to(D).index_select(0, idx.to(D)), flags.index_select(0, idx), "bool")
same(x.to(D).index_select(1, torch.tensor(3).to(D)), x.index_select(1, torch.tensor(3)), "0-dim index")
none = torch.tensor([], dtype=torch.long)
same(x.to(D).index_select(1, none.to(D)), x.index_select(1, none), "empty index")
# nn.Embedding: forward through index_select, backward through
# embedding_dense_backward with repeated indices, padding_idx and
# scale_grad_by_freq.
tokens = torch.tensor([[1, 2, 3, 1], [1, 6, 2, 0]])
for pad, freq in [(None, False), (2, False), (None, True), (1, True)]:
    emb = torch.nn.Embedding(7, 5, padding_idx=pad, scale_grad_by_freq=freq)
    demb = torch.nn.Embedding(7, 5, padding_idx=pad, scale_grad_by_freq=freq).to(D)
    demb.weight.data.copy_(emb.weight.data.to(D))
    for tok, g in [(tokens, torch.randn(2, 4, 5)), (tokens.t(), torch.randn(5, 4, 2).permute(1, 2, 0))]:
        emb.weight.grad = demb.weight.grad = None
        y, dy = emb(tok), demb(tok.to(D))
        same(dy, y, f"embedding {pad} {freq}")
        y.backward(g)
        dy.backward(g.to(D))
        same(demb.weight.grad, emb.weight.grad, f"embedding backward {pad} {freq}")
a, b, c = torch.randn(2, 3), torch.randn(4, 3), torch.randn(3, 2).t()
ia, ib = torch.arange(6).reshape(2, 3), torch.arange(3).reshape(1, 3)
ba, bb = torch.rand(2, 3) > 0.5, torch.rand(2, 3) > 0.5
legacy = torch.empty(0)
cases = {
    "dim 0": ([a, b], 0),
    "dim 1 transposed": ([a, c], 1),
    "dim -1": ([a, c, a], -1),
    "int64": ([ia, ib], 0),
    "bool": ([ba, bb], 1),
    "int64 and float": ([ia, a], 0),
    "bool and int64": ([ba, ia], 0),
    "legacy empty": ([a, legacy, b], 0),
    "empty slice": ([a[:0], b], 0),
}
for name, (ts, dim) in cases.items():
    same(torch.cat([t.to(D) for t in ts], dim), torch.cat(ts, dim), f"cat {name}")
# A view transposed on the device.
same(torch.cat([a.to(D), c.t().contiguous().to(D).t()], 1), torch.cat([a, c], 1), "cat of a device view")
print(sorted(set(torch_fl.fallback_stats()) & {"index_select", "embedding_dense_backward", "cat"}))
"""
    )
    assert out.strip() == "[]", f"indexing fell back to the CPU: {out}"

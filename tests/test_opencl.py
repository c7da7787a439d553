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
import importlib.util

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


def test_batch_and_layer_norm_match_the_cpu_forward_and_backward() -> None:
    out = run(
        """
import copy, importlib.util, warnings
import torch.nn as nn, torch.nn.functional as F
warnings.simplefilter("ignore")  # fallback warnings of the ops around the norms
torch.manual_seed(0)
D = "ocl"
def close(got, want, msg, **kw):
    torch.testing.assert_close(got.cpu(), want, msg=msg, **kw)
torch_fl.reset_fallback_stats()
# Batch norm: training (running stats updated in place, the variance
# unbiased) and evaluation, with and without affine parameters; a
# channels-last input is strided.
for shape, fmt in [((2, 3, 5, 5), None), ((4, 6), None), ((3, 7, 5, 4), torch.channels_last)]:
    for affine in (True, False):
        for training in (True, False):
            tag = f"{shape} affine={affine} training={training}"
            c = shape[1]
            x = (torch.randn(*shape) * 3 + 1).contiguous(memory_format=fmt or torch.contiguous_format)
            rm, rv = torch.randn(c), torch.rand(c) + 0.5
            drm, drv = rm.to(D), rv.to(D)
            w = torch.randn(c, requires_grad=True) if affine else None
            b = torch.randn(c, requires_grad=True) if affine else None
            dw = w.detach().to(D).requires_grad_() if affine else None
            db = b.detach().to(D).requires_grad_() if affine else None
            x.requires_grad_()
            dx = x.detach().to(D).requires_grad_()
            y = F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3)
            dy = F.batch_norm(dx, drm, drv, dw, db, training=training, momentum=0.3)
            close(dy, y, tag)
            close(drm, rm, tag + " running_mean")
            close(drv, rv, tag + " running_var")
            g = torch.randn(*shape)
            y.backward(g)
            dy.backward(g.to(D))
            close(dx.grad, x.grad, tag + " grad input")
            if affine:
                close(dw.grad, w.grad, tag + " grad weight")
                close(db.grad, b.grad, tag + " grad bias")
# The functional overloads, and evaluation mode's saved statistics (this
# host allocates them per channel: the running mean and inverse std).
aten = torch.ops.aten
x, w, b, rm, rv = torch.randn(4, 5, 3), torch.randn(5), torch.randn(5), torch.randn(5), torch.rand(5) + 0.1
d = [t.to(D) for t in (x, w, b, rm, rv)]
for got, want in zip(aten._native_batch_norm_legit.no_stats(*d[:3], True, 0.1, 1e-5),
                     aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)):
    close(got, want, "no_stats")
got = aten._native_batch_norm_legit_no_training(*d, 0.1, 1e-5)
close(got[0], aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)[0], "no_training")
if got[1].numel():
    close(got[1], rm, "eval save_mean")
    close(got[2], 1 / torch.sqrt(rv + 1e-5), "eval save_invstd")
# Layer norm, with and without affine parameters; over two strided dims.
for affine in (True, False):
    ln = nn.LayerNorm(32, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.normal_()
            ln.bias.normal_()
    dln = copy.deepcopy(ln).to(D)
    x = torch.randn(2, 7, 32, requires_grad=True)
    dx = x.detach().to(D).requires_grad_()
    y, dy = ln(x), dln(dx)
    close(dy, y, f"layer norm affine={affine}")
    g = torch.randn(2, 7, 32)
    y.backward(g)
    dy.backward(g.to(D))
    close(dx.grad, x.grad, "layer norm grad input")
    if affine:
        close(dln.weight.grad, ln.weight.grad, "layer norm grad weight")
        close(dln.bias.grad, ln.bias.grad, "layer norm grad bias")
x, w, b = (torch.randn(*s, requires_grad=True) for s in [(4, 6, 5), (5, 4), (5, 4)])
dx, dw, db = (t.detach().to(D).requires_grad_() for t in (x, w, b))
y = F.layer_norm(x.transpose(0, 1), (4, 5), w.t(), b.t())
dy = F.layer_norm(dx.transpose(0, 1), (4, 5), dw.t(), db.t())
close(dy, y, "layer norm, strided")
y.backward(torch.ones_like(y))
dy.backward(torch.ones_like(dy))
for got, want, name in [(dx, x, "input"), (dw, w, "weight"), (db, b, "bias")]:
    close(got.grad, want.grad, "layer norm, strided: grad " + name, atol=1e-4, rtol=1e-4)
# A GPT-like block trains: layer norms around attention and an MLP.
class Block(nn.Module):
    def __init__(self, n=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n), nn.LayerNorm(n)
        self.attn = nn.MultiheadAttention(n, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n, 4 * n), nn.GELU(), nn.Linear(4 * n, n))
    def forward(self, x):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
gpt = nn.Sequential(Block(), nn.LayerNorm(32))
dgpt = copy.deepcopy(gpt).to(D)
x = torch.randn(2, 8, 32)
gpt(x).square().mean().backward()
dgpt(x.to(D)).square().mean().backward()
for (name, p), dp in zip(gpt.named_parameters(), dgpt.parameters()):
    close(dp.grad, p.grad, "gpt " + name, atol=1e-5, rtol=1e-4)
# ResNet-18's train step (convolutions may fall back): its loss, and each
# batch norm's forward and backward on the activations and gradients the
# CPU model saw. (The whole model's gradients are too ill-conditioned to
# compare: its last batch norms see 2 values per channel, and max pooling
# picks its maxima by a rounding.)
resnet = "no torchvision"
if importlib.util.find_spec("torchvision"):
    import torchvision
    r = torchvision.models.resnet18(num_classes=10)
    dr = copy.deepcopy(r).to(D)
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    seen, hooks = [], []
    def before(module, args):  # the module as it was (without hooks), its input
        m = copy.deepcopy(module)
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()
        seen.append([m, args[0].detach().clone()])
    def after(module, args, out):
        out.register_hook(lambda g, case=seen[-1]: case.append(g.clone()))
    for m in r.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
        if isinstance(m, nn.BatchNorm2d):
            hooks += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
    loss = F.cross_entropy(r(x), t)
    loss.backward()
    for h in hooks:
        h.remove()
    assert len(seen) == 20 and all(len(case) == 3 for case in seen), len(seen)
    dloss = F.cross_entropy(dr(x.to(D)), t.to(D))
    dloss.backward()
    # The forward alone differs from float64's by 1e-3 on either device.
    close(dloss, loss.detach(), "resnet loss", rtol=1e-3, atol=1e-5)
    for i, (bn, a, g) in enumerate(seen):
        dbn = copy.deepcopy(bn).to(D)
        a.requires_grad_()
        da = a.detach().to(D).requires_grad_()
        y, dy = bn(a), dbn(da)
        y.backward(g)
        dy.backward(g.to(D))
        for got, want, what in [(dy, y.detach(), "out"), (da.grad, a.grad, "grad input"),
                                (dbn.weight.grad, bn.weight.grad, "grad weight"),
                                (dbn.bias.grad, bn.bias.grad, "grad bias"),
                                (dbn.running_mean, bn.running_mean, "running mean"),
                                (dbn.running_var, bn.running_var, "running var")]:
            scale = want.abs().max().item()
            close(got, want, f"resnet batch norm {i} {what}", rtol=1e-4, atol=1e-5 * max(scale, 1))
    r.eval()
    dr.eval()
    with torch.no_grad():
        close(dr(x.to(D)), r(x), "resnet eval", atol=1e-4, rtol=1e-3)
    resnet = "resnet"
stats = torch_fl.fallback_stats()
assert not [op for op in stats if "norm" in op], stats
print("ok", resnet)
"""
    )
    assert out.strip() == ("ok resnet" if importlib.util.find_spec("torchvision") else "ok no torchvision")

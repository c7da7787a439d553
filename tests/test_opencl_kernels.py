"""The OpenCL plugin's operator families as kernels: convolution, pooling, indexing, reductions, softmax, losses, norms.

Each family's forward and backward against the CPU (or float64 where the
CPU's float32 is the less accurate one), on strided operands, and without
any CPU fallback of the family's operators (_opencl.py runs each case in a
fresh interpreter with the plugin registered as ``ocl``).
"""

from __future__ import annotations

from ._opencl import NEEDS_OPENCL, run

pytestmark = NEEDS_OPENCL


def test_convolutions_forward_and_backward_match_the_cpu() -> None:
    out = run(
        """
import warnings
import torch.nn.functional as F
warnings.simplefilter("ignore")  # the once-per-operator fallback warning (batch norm, ...)
torch.manual_seed(0)
tol = dict(rtol=1e-4, atol=1e-4)

def check(name, xs, ws, *, bias=True, nd=2, tr=False, channels_last=False, x_grad=True, **kw):
    fn = {(1, False): F.conv1d, (2, False): F.conv2d, (1, True): F.conv_transpose1d,
          (2, True): F.conv_transpose2d}[(nd, tr)]
    x, w = torch.randn(*xs), torch.randn(*ws)
    b = torch.randn(ws[1] * kw.get("groups", 1) if tr else ws[0]) if bias else None
    def go(device):
        dx = x.to(device)
        if channels_last:
            dx = dx.contiguous(memory_format=torch.channels_last)
        db = None if b is None else b.to(device).requires_grad_()
        leaves = [dx.requires_grad_(x_grad), w.to(device).requires_grad_(), db]
        y = fn(*leaves, **kw)
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(device))
        return [y] + [None if t is None else t.grad for t in leaves]
    for i, (got, want) in enumerate(zip(go("ocl"), go("cpu"))):
        assert (got is None) == (want is None), (name, i)
        if got is not None:
            assert got.device.type == "ocl", (name, i)
            what = ["output", "input", "weight", "bias"][i]
            torch.testing.assert_close(got.cpu(), want, **tol, msg=f"{name}: {what}")

torch_fl.reset_fallback_stats()
check("3x3, stride 1, padding 1", (2, 3, 8, 9), (4, 3, 3, 3), stride=1, padding=1)
check("ResNet stem: 7x7, stride 2, padding 3", (2, 3, 32, 32), (8, 3, 7, 7), stride=2, padding=3)
check("downsample: 1x1, stride 2, no bias", (2, 6, 8, 8), (5, 6, 1, 1), bias=False, stride=2)
check("groups 2", (2, 4, 7, 7), (6, 2, 3, 3), groups=2, padding=1)
check("depthwise, weight only", (2, 4, 6, 6), (4, 1, 3, 3), groups=4, padding=1, x_grad=False)
check("dilation 2", (1, 3, 10, 11), (4, 3, 3, 3), dilation=2, padding=(2, 1))
check("rectangular", (2, 3, 9, 12), (4, 3, 2, 5), stride=(2, 3), padding=(1, 2), dilation=(2, 1))
check("1-D", (2, 3, 17), (5, 3, 4), nd=1, stride=2, padding=1)
check("channels-last input", (2, 3, 8, 8), (4, 3, 3, 3), channels_last=True, padding=1)
check("transposed", (2, 4, 5, 6), (4, 3, 3, 3), tr=True, stride=2, padding=1, output_padding=1)
check("transposed 1-D, groups 2", (2, 4, 7), (4, 3, 3), nd=1, tr=True, stride=3, groups=2, dilation=2)
# A sliced input and a weight with permuted strides.
x, w = torch.randn(3, 5, 12, 10), torch.randn(6, 3, 4, 3).transpose(2, 3)
dw = torch.empty_strided(w.shape, w.stride(), device="ocl").copy_(w.to("ocl"))
xs, dxs = x[:, 1:4, ::2, 1:], x.to("ocl")[:, 1:4, ::2, 1:]
assert not dxs.is_contiguous() and not dw.is_contiguous()
torch.testing.assert_close(F.conv2d(dxs, dw, padding=1).cpu(), F.conv2d(xs, w, padding=1), **tol)
# An empty batch: the weight gradient is zeros.
dw = torch.randn(2, 3, 3, 3, device="ocl", requires_grad=True)
empty = torch.zeros(0, 3, 5, 5, device="ocl")
y = torch.ops.aten.convolution(empty, dw, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
y.backward(torch.zeros(0, 2, 3, 3, device="ocl"))
torch.testing.assert_close(dw.grad.cpu(), torch.zeros(2, 3, 3, 3))
assert not [op for op in torch_fl.fallback_stats() if "conv" in op], torch_fl.fallback_stats()

assert not [op for op in torch_fl.fallback_stats() if "conv" in op], torch_fl.fallback_stats()
print("ok")
"""
    )
    assert out.strip().startswith("ok"), out


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


def test_batch_and_layer_norm_match_the_cpu_forward_and_backward() -> None:
    out = run(
        """
import copy, warnings
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
stats = torch_fl.fallback_stats()
assert not [op for op in stats if "norm" in op], stats
print("ok")
"""
    )
    assert out.strip() == "ok", out

"""Vision models beyond ResNet, natively: MobileNet-v3, DeepLabV3, Faster R-CNN and ViT, and their kernels.

Each model trains (forward, backward, optimizer step) and evaluates on the
device with the CPU's results and without CPU fallbacks; every kernel they
added is checked against the CPU through the OpInfo conformance machinery,
and torchvision's own operators (``nms``, ``roi_align``) by hand, including
when torchvision is imported after the device was registered. Inputs are
tiny (64x64 images, a two-layer ViT) so the file stays quick; the operators
are the ones full-size models dispatch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

import torch_fl
from torch_fl.compat.vision import DETECTION_TARGETS, fasterrcnn, vit, without_dropout

from .conftest import DEVICE, NO_TORCHVISION, assert_ok, run_python

torchvision = pytest.importorskip("torchvision", reason=NO_TORCHVISION)
nms, roi_align = torchvision.ops.nms, torchvision.ops.roi_align

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

#: Operators these models dispatch whose kernels belong to other workloads
#: (the language-model kernels; the fused attention route with the eval fast
#: path of nn.MultiheadAttention). While the plugin lacks one, it may fall
#: back here; once it has a kernel, it must not.
ELSEWHERE = {
    "arange.start_out": "aten::arange.start_out",
    "_native_multi_head_attention": "aten::_native_multi_head_attention",
}

#: The kernels the vision models added (ATen operators; `hardswish_` has no
#: OpInfo of its own, and `randperm` draws from the device generator, so
#: their own tests check them).
VISION_OPS = [
    "hardswish",
    "hardswish_backward",
    "hardsigmoid",
    "hardsigmoid_backward",
    "log_sigmoid_forward",
    "log_sigmoid_backward",
    "log2",
    "floor",
    "ceil",
    "upsample_bilinear2d",
    "upsample_bilinear2d_backward",
    "upsample_nearest2d",
    "upsample_nearest2d_backward",
    "smooth_l1_loss",
    "smooth_l1_loss_backward",
    "topk",
    "index.Tensor",
    "_index_put_impl_",
    "nonzero",
    "masked_select",
]


def _unserved_elsewhere() -> set[str]:
    return {
        op for op, qual in ELSEWHERE.items() if not torch._C._dispatch_has_kernel_for_dispatch_key(qual, "PrivateUse1")
    }


@contextmanager
def native() -> Iterator[None]:
    """No operator may fall back to the CPU: ``TORCH_FL_FALLBACK=error`` semantics.

    While another branch's operators are still missing from the plugin, those
    (and only those) may fall back, so the mode stays "cpu" for the run.
    """
    allowed = _unserved_elsewhere()
    previous = torch_fl.fallback_mode()
    torch_fl.reset_fallback_stats()
    torch_fl.set_fallback_mode("cpu" if allowed else "error")
    try:
        yield
    finally:
        torch_fl.set_fallback_mode(previous)
    stats = torch_fl.fallback_stats()
    assert set(stats) <= allowed, f"operators fell back to the CPU: {stats}"


def twins(
    make: Callable[[], torch.nn.Module], dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same randomly initialised model on the CPU and on the device, without dropout.

    Dropout draws from each device's own random stream, so with it the two
    could not agree; everything else stays as torchvision builds it.
    """
    torch.manual_seed(0)
    cpu = without_dropout(make()).to(dtype)
    return cpu, copy.deepcopy(cpu).to(DEVICE)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str, **tol: float) -> None:
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), msg=lambda m: f"{what}: {m}", **tol)


def compare_parameters(dev: torch.nn.Module, cpu: torch.nn.Module, grads: bool = True, **tol: float) -> None:
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters(), strict=True):
        if grads and p_cpu.grad is not None:
            close(p_dev.grad, p_cpu.grad, f"grad of {name}", **tol)
        close(p_dev, p_cpu, name, **tol)


def classification_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: str) -> torch.Tensor:
    """One SGD step (momentum) on cross-entropy; returns the loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    out = model(x.to(device))
    out = out["out"] if isinstance(out, dict) else out
    loss = torch.nn.functional.cross_entropy(out, y.to(device))
    loss.backward()
    opt.step()
    return loss.detach()


def check_classifier(make: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step, then evaluation (after the step: running statistics and weights as trained).

    In float64: batch norm over a batch of two at 1x1 resolution (the last
    stages of these networks on tiny images) amplifies rounding in the
    gradients a millionfold, to the 1e-3 level in float32, which would hide
    real errors; in float64 they agree to 1e-5 even where amplified.
    """
    tol = {"rtol": 1e-5, "atol": 1e-7}
    cpu, dev = twins(make, torch.float64)
    x = x.double()
    with native():
        dev_loss = classification_step(dev, x, y, DEVICE)
        dev.eval()
        with torch.no_grad():
            dev_out = dev(x.to(DEVICE))
    cpu_loss = classification_step(cpu, x, y, "cpu")
    cpu.eval()
    with torch.no_grad():
        cpu_out = cpu(x)
    close(dev_loss, cpu_loss, "training loss", **tol)
    compare_parameters(dev, cpu, **tol)
    for (name, b_cpu), b_dev in zip(cpu.named_buffers(), dev.buffers(), strict=True):
        close(b_dev, b_cpu, name, **tol)
    if isinstance(cpu_out, dict):
        cpu_out, dev_out = cpu_out["out"], dev_out["out"]
    close(dev_out, cpu_out, "evaluation output", **tol)


# -- models --------------------------------------------------------------------------


def test_mobilenet_v3_trains_and_evaluates_as_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)
    check_classifier(lambda: torchvision.models.mobilenet_v3_small(weights=None, num_classes=10), x, y)


def test_deeplabv3_trains_and_evaluates_as_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 4, (2, 32, 32), generator=g)

    def make() -> torch.nn.Module:
        return torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=4, aux_loss=False
        )

    check_classifier(make, x, y)


def test_vit_trains_and_evaluates_as_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    check_classifier(vit, x, y)


def detection_batch(device: str) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(4)
    images = [torch.rand(3, 64, 64, generator=g).to(device) for _ in DETECTION_TARGETS]
    targets = [
        {"boxes": torch.tensor(b, device=device), "labels": torch.tensor(labels, device=device)}
        for b, labels in DETECTION_TARGETS
    ]
    return images, targets


def detection_step(model: torch.nn.Module, device: str) -> tuple[dict, list[dict]]:
    """One training step (losses, backward, SGD), then inference on the same images."""
    images, targets = detection_batch(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    losses = model(images, targets)
    sum(losses.values()).backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        detections = model(images)
    return {k: v.detach() for k, v in losses.items()}, detections


def test_faster_rcnn_trains_and_detects_as_on_the_cpu() -> None:
    cpu, dev = twins(fasterrcnn)
    with native():
        dev_losses, dev_det = detection_step(dev, DEVICE)
    cpu_losses, cpu_det = detection_step(cpu, "cpu")
    assert dev_losses.keys() == cpu_losses.keys()
    for name, loss in cpu_losses.items():
        close(dev_losses[name], loss, name, rtol=1e-5, atol=1e-6)
    # Weights after the step; float32 gradients of the first layers differ
    # at the 1e-4 level (see check_classifier), scaled down by the rate.
    compare_parameters(dev, cpu, grads=False, rtol=1e-4, atol=1e-5)
    assert len(dev_det) == len(cpu_det)
    for i, (d, c) in enumerate(zip(dev_det, cpu_det)):
        assert c["boxes"].shape[0] > 0, "the comparison needs detections"
        assert d["boxes"].shape == c["boxes"].shape and d["boxes"].device.type == DEVICE, i
        assert torch.equal(d["labels"].cpu(), c["labels"]), i
        close(d["scores"], c["scores"], f"scores of image {i}", rtol=1e-4, atol=1e-6)
        # Pixel coordinates from trained regression weights: float32 rounding
        # of the step shows at the 1e-4 level.
        close(d["boxes"], c["boxes"], f"boxes of image {i}", rtol=1e-3, atol=0.05)


def test_mobilenet_v3_under_bfloat16_autocast_runs_natively() -> None:
    cpu, dev = twins(lambda: torchvision.models.mobilenet_v3_small(weights=None, num_classes=10))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = cpu.eval()(x)
    dev.eval()
    with native(), torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = dev(x.to(DEVICE))
    assert out.dtype == torch.bfloat16
    close(out.float(), reference, "bfloat16 logits", rtol=0.1, atol=0.1)


def test_faster_rcnn_under_bfloat16_autocast_runs_natively() -> None:
    # torchvision's autocast policy (nms and roi_align in float32) covers
    # CUDA, CPU and XPU; torch-fl gives the device the same.
    _, dev = twins(fasterrcnn)
    images, _ = detection_batch(DEVICE)
    dev.eval()
    with native(), torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        detections = dev(images)
    assert all(d["boxes"].dtype == torch.float32 and d["boxes"].shape[0] > 0 for d in detections)


def test_torchvision_operators_follow_cudas_autocast_policy() -> None:
    g = torch.Generator().manual_seed(14)
    xy = torch.rand(60, 2, generator=g) * 30
    boxes = torch.cat([xy, xy + 1 + torch.rand(60, 2, generator=g) * 10], dim=1)
    scores = torch.rand(60, generator=g)
    x = torch.randn(1, 2, 8, 8, generator=g)
    rois = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0]])
    with native(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        keep = nms(boxes.to(DEVICE).bfloat16(), scores.to(DEVICE), 0.5)
        pooled = roi_align(x.to(DEVICE).bfloat16(), rois.to(DEVICE), 2, 1.0, 2, True)
    assert torch.equal(keep.cpu(), nms(boxes.bfloat16().float(), scores, 0.5))
    assert pooled.dtype == torch.bfloat16
    close(pooled.float(), roi_align(x.bfloat16().float(), rois, 2, 1.0, 2, True).bfloat16().float(), "roi_align")


# -- kernels against the CPU ------------------------------------------------------------


def test_new_kernels_conform_to_the_cpu_on_opinfo_samples() -> None:
    result = torch_fl.test_compatibility(DEVICE, VISION_OPS, coverage=False, integrity=False, progress=False)
    for op in result.ops:
        assert op.status == "passed", (op.name, op.status, op.reason, [f.error for c in op.checks for f in c.failures])
        assert op.samples_run > 0, op.name


def test_half_precision_kernels_conform_to_the_cpu() -> None:
    # Not topk: low precision makes ties common, and the order of tied
    # elements is unspecified (the CPU's and CUDA's differ too).
    ops = ["hardswish", "hardsigmoid", "upsample_bilinear2d", "upsample_nearest2d", "index.Tensor"]
    result = torch_fl.test_compatibility(
        DEVICE, ops, dtypes=(torch.bfloat16, torch.float16), coverage=False, integrity=False, progress=False
    )
    for op in result.ops:
        assert op.status == "passed", (op.name, op.status, op.reason, [f.error for c in op.checks for f in c.failures])


def test_nms_matches_torchvision_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(6)
    xy = torch.rand(300, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + 1 + torch.rand(300, 2, generator=g) * 20], dim=1)
    scores = torch.rand(300, generator=g)
    scores[10:20] = scores[0]  # ties keep index order
    for dtype in (torch.float32, torch.float64):
        for threshold in (0.0, 0.3, 0.7, 1.0):
            b, s = boxes.to(dtype), scores.to(dtype)
            with native():
                keep = nms(b.to(DEVICE), s.to(DEVICE), threshold)
            assert keep.dtype == torch.int64 and keep.device.type == DEVICE
            assert torch.equal(keep.cpu(), nms(b, s, threshold)), (dtype, threshold)
    with native():
        empty = nms(torch.empty(0, 4, device=DEVICE), torch.empty(0, device=DEVICE), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64


@pytest.mark.parametrize(("aligned", "sampling_ratio", "scale"), [(False, 0, 0.5), (True, 2, 0.25), (True, -1, 1.0)])
def test_roi_align_and_its_gradient_match_torchvision_on_the_cpu(aligned: bool, sampling_ratio: int, scale: float):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 12, 10, generator=g, dtype=torch.float64)
    corners = torch.rand(7, 2, generator=g, dtype=torch.float64) * 30
    rois = torch.cat(
        [
            torch.tensor([0, 1, 1, 0, 1, 0, 1.0], dtype=torch.float64)[:, None],
            corners,
            corners + 4 + 10 * torch.rand(7, 2, generator=g, dtype=torch.float64),
        ],
        dim=1,
    )
    rois[3, 1:] = torch.tensor([-8.0, -8.0, 70.0, 70.0])  # partly outside the map
    x_cpu = x.clone().requires_grad_()
    x_dev = x.to(DEVICE).requires_grad_()
    expected = roi_align(x_cpu, rois, (3, 2), scale, sampling_ratio, aligned)
    with native():
        actual = roi_align(x_dev, rois.to(DEVICE), (3, 2), scale, sampling_ratio, aligned)
        weights = torch.randn(expected.shape, generator=g, dtype=torch.float64)
        (actual * weights.to(DEVICE)).sum().backward()
    (expected * weights).sum().backward()
    close(actual, expected, "roi_align", rtol=1e-12, atol=1e-12)
    close(x_dev.grad, x_cpu.grad, "roi_align gradient", rtol=1e-12, atol=1e-12)


def test_roi_align_in_float32_as_the_box_head_calls_it() -> None:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 4, 8, 8, generator=g)
    rois = torch.tensor([[0, 1.0, 1.0, 30.0, 20.0], [1, 0.0, 5.0, 12.0, 31.0]])
    with native():
        actual = torchvision.ops.MultiScaleRoIAlign(["0"], 7, 2)(
            {"0": x.to(DEVICE)}, [rois[:1, 1:].to(DEVICE), rois[1:, 1:].to(DEVICE)], [(32, 32), (32, 32)]
        )
    expected = torchvision.ops.MultiScaleRoIAlign(["0"], 7, 2)(
        {"0": x}, [rois[:1, 1:], rois[1:, 1:]], [(32, 32), (32, 32)]
    )
    close(actual, expected, "MultiScaleRoIAlign", rtol=1e-5, atol=1e-6)


def test_advanced_indexing_matches_the_cpu() -> None:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(5, 6, 7, generator=g)
    mask = x[:, :, 0] > 0
    idx = torch.tensor([4, -1, 0, 2])
    cases = [
        lambda t, m, i: t[i],
        lambda t, m, i: t[m],
        lambda t, m, i: t[:, i],
        lambda t, m, i: t[i, :, i[:2, None]],  # non-adjacent indices: broadcast dims first
        lambda t, m, i: t[m, i[:1]],
        lambda t, m, i: t[i[:, None], i[None, :3]],
        lambda t, m, i: t[m.nonzero(as_tuple=True)],
    ]
    with native():
        for k, case in enumerate(cases):
            close(case(x.to(DEVICE), mask.to(DEVICE), idx.to(DEVICE)), case(x, mask, idx), f"case {k}", rtol=0, atol=0)
        # Index tensors on the CPU are moved to the device, as CUDA does.
        close(x.to(DEVICE)[idx, :, idx[:1]], x[idx, :, idx[:1]], "CPU indices", rtol=0, atol=0)
    # Indices are data: as on CUDA, a bad one is reported asynchronously,
    # by the next synchronization.
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0 with size 5"):
        x.to(DEVICE)[torch.tensor([5]).to(DEVICE)].cpu()


def test_index_put_matches_the_cpu() -> None:
    g = torch.Generator().manual_seed(10)
    base = torch.randn(6, 4, generator=g)
    idx = torch.tensor([1, 3, 1, 5, 1])  # repeats: accumulate sums them in order
    values = torch.randn(5, 4, generator=g)
    mask = base[:, 0] > 0
    with native():
        for accumulate in (False, True):
            dev = base.to(DEVICE).index_put_((idx.to(DEVICE),), values.to(DEVICE), accumulate=accumulate)
            cpu = base.clone().index_put_((idx,), values, accumulate=accumulate)
            if accumulate:
                close(dev, cpu, "accumulate", rtol=1e-6, atol=1e-6)
            else:
                rows = idx.unique()
                close(dev[rows.to(DEVICE)], cpu[rows], "put", rtol=0, atol=0)
        dev = base.to(DEVICE)
        dev[mask.to(DEVICE)] = 7.0
        cpu = base.clone()
        cpu[mask] = 7.0
        close(dev, cpu, "masked assignment", rtol=0, atol=0)
        counts = torch.zeros(4, dtype=torch.int64).to(DEVICE)
        counts.index_put_((torch.tensor([0, 2, 2, 3]).to(DEVICE),), torch.tensor(1).to(DEVICE), accumulate=True)
        assert counts.cpu().tolist() == [1, 0, 2, 1]
    with pytest.raises(RuntimeError, match="shape mismatch"):
        base.to(DEVICE)[mask.to(DEVICE)] = torch.ones(99, 4).to(DEVICE)


def test_data_dependent_shapes_wait_for_queued_work() -> None:
    # A large queued product, then nonzero on its result: the kernel must
    # read the finished values (it waits for its stream), as CUDA syncs.
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(11))
    with native():
        y = a.to(DEVICE) @ a.to(DEVICE).T
        found = torch.nonzero(y > 1.0)
        picked = torch.masked_select(y, y > 1.0)
        empty = torch.nonzero(torch.zeros(3, 0, device=DEVICE))
        scalar = torch.nonzero(torch.tensor(2.0, device=DEVICE))
        ints = torch.nonzero(torch.tensor([0, 3, 0, -1], dtype=torch.int32, device=DEVICE))
    expected = a @ a.T
    assert torch.equal(found.cpu(), torch.nonzero(expected > 1.0))
    close(picked, torch.masked_select(expected, expected > 1.0), "masked_select", rtol=1e-4, atol=1e-4)
    assert empty.shape == (0, 2) and scalar.shape == (1, 0)
    assert ints.cpu().flatten().tolist() == [1, 3]


def test_topk_orders_nan_and_ties_like_the_cpu() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0, 3.0, -2.0], [0.0, 5.0, 5.0, 5.0, 1.0]])
    with native():
        values, indices = x.to(DEVICE).topk(3)
        low_values, _ = x.to(DEVICE).topk(2, largest=False)
        big = torch.arange(10_000, dtype=torch.float32).flip(0).reshape(2, 5000)
        big_values, big_indices = big.to(DEVICE).topk(4, dim=1)
    close(values, x.topk(3).values, "values", rtol=0, atol=0, equal_nan=True)
    assert indices.cpu().tolist() == [[1, 2, 3], [1, 2, 3]]
    close(low_values, x.topk(2, largest=False).values, "smallest", rtol=0, atol=0)
    assert torch.equal(big_indices.cpu(), big.topk(4, dim=1).indices)
    assert torch.equal(big_values.cpu(), big.topk(4, dim=1).values)


def test_randperm_is_a_permutation_reproducible_from_the_seed() -> None:
    with native():
        torch.manual_seed(12)
        first = torch.randperm(1000, device=DEVICE)
        torch.manual_seed(12)
        again = torch.randperm(1000, device=DEVICE)
        other = torch.randperm(1000, device=DEVICE)
    assert sorted(first.cpu().tolist()) == list(range(1000))
    assert torch.equal(first.cpu(), again.cpu()) and not torch.equal(first.cpu(), other.cpu())


def test_upsampling_with_scale_factors_and_corners_matches_the_cpu() -> None:
    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    calls = [
        dict(scale_factor=2.0, mode="nearest"),
        dict(scale_factor=1.7, mode="nearest", recompute_scale_factor=False),
        dict(size=(9, 4), mode="nearest"),
        dict(size=(11, 13), mode="bilinear", align_corners=True),
        dict(scale_factor=0.6, mode="bilinear", align_corners=False, recompute_scale_factor=False),
        dict(size=(1, 1), mode="bilinear", align_corners=True),
    ]
    for kw in calls:
        x_cpu, x_dev = x.clone().requires_grad_(), x.to(DEVICE).requires_grad_()
        expected = torch.nn.functional.interpolate(x_cpu, **kw)
        with native():
            actual = torch.nn.functional.interpolate(x_dev, **kw)
            actual.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        close(actual, expected, str(kw), rtol=1e-12, atol=1e-12)
        close(x_dev.grad, x_cpu.grad, f"gradient, {kw}", rtol=1e-12, atol=1e-12)


def test_in_place_hardswish_matches_the_cpu() -> None:
    x = torch.linspace(-5, 5, 41)
    dev = x.to(DEVICE)
    with native():
        torch.nn.functional.hardswish(dev, inplace=True)
    close(dev, torch.nn.functional.hardswish(x), "hardswish_", rtol=0, atol=0)


def test_rounding_keeps_integer_tensors() -> None:
    x = torch.tensor([-3, 0, 7], dtype=torch.int32)
    with native():
        for f in (torch.floor, torch.ceil):
            out = f(x.to(DEVICE))
            assert out.dtype == torch.int32 and out.cpu().tolist() == [-3, 0, 7]
        logs = torch.log2(x.to(DEVICE).abs() + 1)
    close(logs, torch.log2(x.abs() + 1), "log2 of ints", rtol=1e-6, atol=1e-6)


# -- other libraries' operators: late binding ------------------------------------------


def test_torchvision_imported_after_registration_binds_its_operators() -> None:
    out = assert_ok(
        run_python(
            """
            import sys, torch, torch_fl
            handle = torch_fl.register_device_plugin(name="sim")
            assert "torchvision" not in sys.modules
            print("before", handle.registrations["torchvision::nms"], handle.registrations["torchvision::roi_align"])
            import torchvision
            from torchvision.ops import nms, roi_align
            torch_fl.set_fallback_mode("error")
            boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]])
            scores = torch.tensor([0.9, 0.8, 0.7])
            keep = nms(boxes.to("sim"), scores.to("sim"), 0.5)
            x = torch.randn(1, 2, 8, 8)
            rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 6.0]])
            xd = x.to("sim").requires_grad_()
            roi_align(xd, rois.to("sim"), 2, 1.0, 2, True).sum().backward()
            xc = x.clone().requires_grad_()
            roi_align(xc, rois, 2, 1.0, 2, True).sum().backward()
            torch.testing.assert_close(xd.grad.cpu(), xc.grad)
            bound = torch._C._dispatch_has_kernel_for_dispatch_key("torchvision::nms", "PrivateUse1")
            print("after", keep.cpu().tolist(), bound, torch_fl.fallback_stats())
            """
        )
    )
    assert "before deferred deferred" in out
    assert "after [0, 2] True {}" in out


def test_torchvision_imported_first_is_bound_at_registration() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torchvision, torch_fl
            handle = torch_fl.register_device_plugin(name="sim")
            print(handle.registrations["torchvision::nms"], handle.registrations["torchvision::_roi_align_backward"])
            print(torch._C._dispatch_has_kernel_for_dispatch_key("torchvision::roi_align", "PrivateUse1"))
            """
        )
    )
    assert out.split() == ["registered", "registered", "True"]


def test_a_library_whose_schema_differs_is_not_bound() -> None:
    # A library defining torchvision::roi_align with another signature than
    # the plugin's kernel expects: binding is refused with a warning naming
    # both schemas (on stderr, as the fallback's own warnings), and the call
    # runs through the fallback policy.
    result = run_python(
        """
        import torch, torch_fl
        torch_fl.register_device_plugin(name="sim")
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("roi_align(Tensor input, float scale) -> Tensor")
        lib.impl("roi_align", lambda x, s: x * s, "CPU")
        y = torch.ops.torchvision.roi_align(torch.ones(2, device="sim"), 3.0)
        print(y.cpu().tolist(), torch_fl.fallback_stats())
        """
    )
    out = assert_ok(result)
    assert "[3.0, 3.0] {'torchvision::roi_align': 1}" in out
    assert "was written for the schema" in result.stderr and "roi_align(Tensor input, float scale)" in result.stderr

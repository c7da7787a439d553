"""torchvision models for the coverage report: classification, segmentation, detection and a transformer.

Each entry wraps a torchvision model so the coverage harness can treat it like
the others (one input tensor in, one tensor out, ``out.sum().backward()``): a
training forward (batch-norm statistics updated, detection losses from fixed
targets) followed by an evaluation forward without gradients, so the report
covers what both modes dispatch. Inputs are tiny (32x32 images, 64x64 for
detection, a ViT with two layers) to keep the report fast; weights are random (``weights=None``),
nothing is downloaded.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["DETECTION_TARGETS", "fasterrcnn", "vision_models", "vit", "without_dropout"]

#: A model to cover: its label, how to build it, and how to make its input.
_Model = tuple[str, Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]

#: Ground-truth boxes (x1, y1, x2, y2) and labels of the two 64x64 images the
#: detection entry trains on.
DETECTION_TARGETS: list[tuple[list[list[float]], list[int]]] = [
    ([[4.0, 4.0, 30.0, 30.0], [20.0, 28.0, 60.0, 62.0]], [1, 2]),
    ([[10.0, 12.0, 50.0, 60.0]], [2]),
]


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Disable every dropout of ``model`` (in place) and return it.

    The CPU's and a device's random streams differ, so with dropout their
    training outputs could not be compared.
    """
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


class _TrainThenEval(torch.nn.Module):
    """Runs a classifier or segmenter in training mode, then (without gradients) in evaluation mode."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = without_dropout(model)

    def forward(self, x: torch.Tensor) -> Any:
        self.model.train()
        out = self.model(x)
        with torch.no_grad():
            self.model.eval()
            self.model(x)
        self.model.train()
        return out["out"] if isinstance(out, dict) else out


class _Detection(torch.nn.Module):
    """Faster R-CNN: the summed training losses for :data:`DETECTION_TARGETS`, then an inference pass."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        device = images.device
        targets = [
            {"boxes": torch.tensor(boxes, device=device), "labels": torch.tensor(labels, device=device)}
            for boxes, labels in DETECTION_TARGETS[: images.shape[0]]
        ]
        self.model.train()
        losses = self.model(list(images), targets)
        with torch.no_grad():
            self.model.eval()
            self.model(list(images))
        self.model.train()
        return torch.stack(list(losses.values())).sum()


def fasterrcnn(num_classes: int = 3) -> torch.nn.Module:
    """A small Faster R-CNN (MobileNet-v3 FPN backbone) for 64x64 images.

    Every anchor and proposal is sampled for the losses (batch sizes far above
    their counts), so training is deterministic and comparable with the CPU.
    """
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    model: torch.nn.Module = fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None,
        weights_backbone=None,
        num_classes=num_classes,
        min_size=64,
        max_size=64,
        rpn_batch_size_per_image=100_000,
        box_batch_size_per_image=100_000,
    )
    return model


def vit() -> torch.nn.Module:
    """A two-layer ViT for 32x32 images (patches of 8)."""
    from torchvision.models import VisionTransformer

    model: torch.nn.Module = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    )
    return model


def vision_models() -> list[_Model]:
    """The torchvision coverage models; raises ImportError without torchvision."""
    from torchvision.models import mobilenet_v3_small
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    return [
        (
            "mobilenet_v3_small (2x3x32x32, train+eval)",
            lambda: _TrainThenEval(mobilenet_v3_small(weights=None, num_classes=10)),
            lambda: torch.randn(2, 3, 32, 32),
        ),
        (
            "deeplabv3_mobilenet_v3_large (2x3x32x32, train+eval)",
            lambda: _TrainThenEval(
                deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4, aux_loss=False)
            ),
            lambda: torch.randn(2, 3, 32, 32),
        ),
        (
            "fasterrcnn_mobilenet_v3_large_fpn (2x3x64x64, train losses+eval)",
            lambda: _Detection(fasterrcnn()),
            lambda: torch.rand(2, 3, 64, 64),
        ),
        ("vit (2 layers, 2x3x32x32, train+eval)", lambda: _TrainThenEval(vit()), lambda: torch.randn(2, 3, 32, 32)),
    ]

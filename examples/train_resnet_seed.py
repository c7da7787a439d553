"""The seed design's reference training script, unchanged but for the device.

Only the device string (``DEVICE``), the step count and the image size are
configurable, so CI can run it small::

    python examples/train_resnet_seed.py --device sim --steps 2 --image-size 32

With ``--device cpu`` it is the same script on the CPU.
"""

import argparse

import torch
import torchvision

import torch_fl

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--device", default="sim")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--image-size", type=int, default=224)
args = parser.parse_args()

if args.device != "cpu":
    torch_fl.register_device_plugin(name=args.device)
DEVICE = args.device

# --- the seed script, verbatim below this line but for DEVICE ---------------
model = torchvision.models.resnet50(weights=None).to(DEVICE)
dataset = torchvision.datasets.FakeData(
    size=args.steps * 8,
    image_size=(3, args.image_size, args.image_size),
    num_classes=1000,
    transform=torchvision.transforms.ToTensor(),
)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, pin_memory=True)
criterion = torch.nn.CrossEntropyLoss().to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

model.train()
for step, (images, labels) in enumerate(loader):
    images, labels = images.to(DEVICE), labels.to(DEVICE)
    optimizer.zero_grad()
    loss = criterion(model(images), labels)
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")

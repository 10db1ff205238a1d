"""The workloads of bench/bench_suspend.py: a ResNet-50-shaped CNN and a transformer encoder.

Both are plain torch.nn (no torchvision) and train on one fixed synthetic
batch, so nothing is downloaded. `SIZES` scales them: "full" is ResNet-50
itself at 224x224, batch 64, and a 6-layer, 512-wide encoder over a
32,000-token vocabulary (the size of a translation model); "small" and "tiny"
are CPU-sized versions with the same structure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

MODELS = ("resnet50", "transformer")
SIZES = {  # resnet: blocks per stage, base width, image side, batch, classes
    "tiny": {"resnet50": (1, 1, 1, 1, 4, 16, 2, 10), "transformer": (1, 16, 2, 32, 50, 8, 2)},
    "small": {"resnet50": (1, 1, 1, 1, 16, 32, 8, 10), "transformer": (2, 64, 4, 256, 2000, 32, 8)},
    "full": {
        "resnet50": (3, 4, 6, 3, 64, 224, 64, 1000),
        "transformer": (6, 512, 8, 2048, 32000, 128, 32),
    },
}  # transformer: layers, width, heads, feed-forward width, vocabulary, sequence, batch


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3, 1x1 expand (x4), plus the shortcut."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output: relu(body(x) + shortcut(x))."""
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(blocks: tuple[int, ...], base: int, classes: int) -> nn.Module:
    """A ResNet-50-shaped network: with blocks (3, 4, 6, 3) and base 64, ResNet-50 itself."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, base, 7, 2, 3, bias=False),
        nn.BatchNorm2d(base),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    inputs = base
    for stage, count in enumerate(blocks):
        width = base * 2**stage
        for index in range(count):
            layers.append(Bottleneck(inputs, width, 2 if index == 0 and stage > 0 else 1))
            inputs = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
    return nn.Sequential(*layers)


class Encoder(nn.Module):
    """Token embedding, a transformer encoder and a per-token output layer."""

    def __init__(self, layers: int, width: int, heads: int, ff: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, ff, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits, (batch, sequence, vocabulary)."""
        logits: torch.Tensor = self.head(self.encoder(self.embed(tokens)))
        return logits


@dataclass
class Workload:
    """A model, its optimizer and one training iteration on a fixed batch."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    iteration: Callable[[], torch.Tensor]
    parameters: int


def build(name: str, size: str, device: torch.device) -> Workload:
    """The model `name` at `size` on `device`, with synthetic data drawn from a fixed seed."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    spec = SIZES[size][name]
    model: nn.Module
    if name == "resnet50":
        *blocks, base, side, batch, classes = spec
        model = resnet(tuple(blocks), base, classes).to(device)
        x = torch.randn(batch, 3, side, side, generator=gen).to(device)
        y = torch.randint(0, classes, (batch,), generator=gen).to(device)
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=0.01, momentum=0.9
        )
        vocab = classes
    else:
        layers, width, heads, ff, vocab, sequence, batch = spec
        model = Encoder(layers, width, heads, ff, vocab).to(device)
        x = torch.randint(0, vocab, (batch, sequence), generator=gen).to(device)
        y = torch.randint(0, vocab, (batch, sequence), generator=gen).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    def iteration() -> torch.Tensor:
        loss: torch.Tensor = loss_fn(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss

    parameters = sum(p.numel() for p in model.parameters())
    return Workload(model, optimizer, iteration, parameters)

"""Four small training tasks for goodput tuning, each a different kind of model.

Used by bench/bench_adaptive.py (time to a validation loss, adaptive against
fixed batch sizes) and by tests/test_runner_gns_validation.py (the runner's
gradient-noise estimate against a brute-force one). All data is generated
here from a seed; nothing is downloaded. Each task has noisy targets, so its
gradient noise grows as the loss falls and large batches stay useful:

- ``mlp``: a 32-64-10 MLP, plain SGD, on features of power-law scales, labels drawn from
  a random linear teacher's softmax (an ill-conditioned problem, learnt over thousands of
  steps);
- ``cnn``: two 3x3 convolutions on 12x12 images of noisy class templates, SGD
  with momentum 0.9;
- ``transformer``: a causal transformer language model with token embeddings
  over a 1,000-token vocabulary of Zipf-distributed frequencies (most rows
  of the embedding are seen rarely), AdamW, on sequences from a random
  Markov chain;
- ``lstm``: an LSTM language model over 32 tokens, Adam, on sequences from
  a random second-order Markov chain (the successor of each pair of tokens).

Each task's learning rate at its initial batch size is tuned there
(bench/bench_adaptive.py ``--tune-lr``: the multiple of 0.25x to 16x with
the lowest validation loss after 1,000 steps), as Pollux presumes. The SGD
tasks scale their learning rate with AdaScale, the Adam ones with the
square root of the batch-size ratio, as `gpuq.runner.tuning` recommends.
Every task allows batches up to 64 times its initial one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

Batch = tuple[torch.Tensor, torch.Tensor]


class Samples(Dataset[Any]):
    """Tensors fetched a whole batch at a time (``__getitems__``), as a fast loader would."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, indices: list[int]) -> Batch:
        index = torch.tensor(indices)
        return self.x[index], self.y[index]


def keep(batch: Any) -> Any:
    """The identity collate function: `Samples.__getitems__` already returns a batch."""
    return batch


@dataclass(frozen=True)
class Task:
    """A model kind with its data, optimizer and batch sizes."""

    name: str
    make_data: Callable[[int, int], Samples]
    """(samples, seed) -> a dataset; the validation set uses another seed."""
    make_model: Callable[[], nn.Module]
    make_optimizer: Callable[[nn.Module, float], torch.optim.Optimizer]
    """(model, learning rate) -> the optimizer."""
    lr: float
    """The learning rate at the initial batch size (see `LR_GRID`)."""
    lr_scaling: str
    init_batch: int
    max_batch: int
    lr_decay: float
    """Per-epoch factor of the learning rate (StepLR)."""

    def optimizer(self, model: nn.Module, lr_factor: float = 1.0) -> torch.optim.Optimizer:
        """The task's optimizer over `model`, at `lr_factor` times its learning rate."""
        return self.make_optimizer(model, self.lr * lr_factor)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The mean cross-entropy of a batch: per sample, or per token for the language models."""
        x, y = batch
        logits: torch.Tensor = model(x)
        return nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten())


FEATURES, CLASSES = 32, 10


def _teacher_labels(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator).squeeze(1)


FEATURE_DECAY = 1.0
"""The k-th feature's standard deviation is k ** -FEATURE_DECAY (`mlp_data`)."""


def mlp_data(samples: int, seed: int) -> Samples:
    """Gaussian features of power-law scales, labelled by a linear teacher's softmax (noisy labels).

    The k-th feature's scale is k ** -`FEATURE_DECAY` and the teacher weighs it by
    the inverse square root of that, so every feature carries some of the signal and
    the faint ones take the longest to learn: an ill-conditioned problem, learnt over
    thousands of steps at the largest stable learning rate, whose gradient noise scale
    grows as the loss falls. (Features of one scale were learnt within a few hundred
    steps, and the target then lay where the schedule decided.)
    """
    fixed = torch.Generator().manual_seed(1)
    scales = torch.arange(1, FEATURES + 1, dtype=torch.float) ** -FEATURE_DECAY
    teacher = 1.5 * torch.randn(FEATURES, CLASSES, generator=fixed) * scales.rsqrt()[:, None]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator) * scales
    return Samples(x, _teacher_labels(x @ teacher, generator))


SIDE = 12


def cnn_data(samples: int, seed: int) -> Samples:
    """12x12 images: a class's smooth template, shifted up to 2 pixels, in noise; noisy labels."""
    fixed = torch.Generator().manual_seed(2)
    coarse = torch.randn(CLASSES, 1, 4, 4, generator=fixed)
    templates = nn.functional.interpolate(coarse, size=(SIDE, SIDE), mode="bilinear")
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, CLASSES, (samples,), generator=generator)
    shifts = torch.randint(-2, 3, (samples, 2), generator=generator)
    images = torch.stack(
        [
            torch.roll(templates[c], (int(dy), int(dx)), dims=(1, 2))
            for c, (dy, dx) in zip(classes.tolist(), shifts.tolist(), strict=True)
        ]
    )
    images = images + 1.2 * torch.randn(images.shape, generator=generator)
    flipped = torch.rand(samples, generator=generator) < 0.25  # a quarter of labels are wrong
    wrong = torch.randint(0, CLASSES, (samples,), generator=generator)
    return Samples(images, torch.where(flipped, wrong, classes))


def _markov_sequences(
    samples: int, seed: int, vocab: int, length: int, zipf: bool, follow: float, order: int = 1
) -> Samples:
    """Sequences whose next token is a fixed successor with probability `follow`, else fresh.

    The successor is a fixed random function of the previous `order` tokens (a table
    of vocab ** order entries: the larger, the longer a model takes to learn it).
    Fresh tokens are uniform, or Zipf-distributed (frequency 1 / rank) with `zipf`.
    """
    fixed = torch.Generator().manual_seed(vocab)
    successor = torch.randint(0, vocab, (vocab**order,), generator=fixed)
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float) if zipf else torch.ones(vocab)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.empty(samples, length + order, dtype=torch.long)
    for t in range(order):
        tokens[:, t] = torch.multinomial(weights, samples, replacement=True, generator=generator)
    for t in range(order, length + order):
        fresh = torch.multinomial(weights, samples, replacement=True, generator=generator)
        keep_chain = torch.rand(samples, generator=generator) < follow
        context = torch.zeros(samples, dtype=torch.long)
        for back in range(order, 0, -1):
            context = context * vocab + tokens[:, t - back]
        tokens[:, t] = torch.where(keep_chain, successor[context], fresh)
    tokens = tokens[:, order - 1 :]
    return Samples(tokens[:, :-1], tokens[:, 1:])


LM_VOCAB, LM_LENGTH, LM_WIDTH = 1000, 16, 32


def lm_data(samples: int, seed: int) -> Samples:
    """Zipf-distributed token sequences from a random Markov chain, shifted by one as targets."""
    return _markov_sequences(samples, seed, LM_VOCAB, LM_LENGTH, zipf=True, follow=0.5)


class CausalLM(nn.Module):
    """Token and position embeddings, a causal transformer encoder, a per-token head."""

    def __init__(self, vocab: int = LM_VOCAB, width: int = LM_WIDTH, layers: int = 1) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(0.02 * torch.randn(LM_LENGTH, width))
        layer = nn.TransformerEncoderLayer(
            width, 2, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LM_LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, length, vocab)."""
        embedded = self.tokens(tokens) + self.positions
        mask = self.get_buffer("mask")
        hidden = self.encoder(embedded, mask=mask, is_causal=True)
        logits: torch.Tensor = self.head(hidden)
        return logits


RNN_VOCAB, RNN_LENGTH, RNN_HIDDEN = 32, 24, 64


def rnn_data(samples: int, seed: int) -> Samples:
    """Uniform token sequences from a random second-order Markov chain, shifted by one as targets.

    Second order (the successor of each pair of tokens, 1,024 pairs): a first-order chain
    was learnt within a few hundred steps, too short for a tuner to pay off.
    """
    return _markov_sequences(samples, seed, RNN_VOCAB, RNN_LENGTH, zipf=False, follow=0.6, order=2)


class RecurrentLM(nn.Module):
    """A token embedding, one LSTM layer and a per-token head."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(RNN_VOCAB, 16)
        self.lstm = nn.LSTM(16, RNN_HIDDEN, batch_first=True)
        self.head = nn.Linear(RNN_HIDDEN, RNN_VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, length, vocab)."""
        hidden, _ = self.lstm(self.tokens(tokens))
        logits: torch.Tensor = self.head(hidden)
        return logits


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def mlp(hidden: int = 64) -> nn.Module:
    """The MLP task's model: FEATURES -> `hidden` -> CLASSES with a ReLU."""
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


TASKS: dict[str, Task] = {
    "mlp": Task(
        "mlp",
        mlp_data,
        mlp,
        lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr),
        0.4,  # --tune-lr: 2x of 0.2
        "adascale",
        init_batch=16,
        max_batch=1024,
        lr_decay=0.8,
    ),
    "cnn": Task(
        "cnn",
        cnn_data,
        _cnn,
        lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        0.04,  # --tune-lr: 2x of 0.02
        "adascale",
        init_batch=16,
        max_batch=1024,
        lr_decay=0.8,
    ),
    "transformer": Task(
        "transformer",
        lm_data,
        CausalLM,
        lambda model, lr: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01),
        4e-3,  # --tune-lr: 2x of 2e-3
        "sqrt",
        init_batch=20,
        max_batch=1280,
        lr_decay=0.8,
    ),
    "lstm": Task(
        "lstm",
        rnn_data,
        RecurrentLM,
        lambda model, lr: torch.optim.Adam(model.parameters(), lr=lr),
        1.2e-2,  # --tune-lr: 4x of 3e-3
        "sqrt",
        init_batch=16,
        max_batch=1024,
        lr_decay=0.8,
    ),
}
"""The four model kinds, by name."""

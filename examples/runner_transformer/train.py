"""Train a small transformer to reverse sequences, with gpuq.runner, so gpuq can suspend it.

The task is generated: random token sequences, and the model must output
each one reversed (position i of the answer is the input's token at
position length-1-i). Attention has to learn to look across the sequence,
which a bag of tokens cannot do; a CPU learns it in seconds at the default
size, and nothing is downloaded. The model is a token and position
embedding, a `nn.TransformerEncoder` with dropout, and a linear head.

The runner wiring is the same as examples/runner_mlp: the state in a
`gq.State`, the data in a `gq.AdaptiveDataLoader`, `gq.step()` at the end of
every iteration. With ``--no-runner`` the script makes no gpuq call at all
(a plain DataLoader and a plain epoch loop); outside gpuq both ways train to
the same parameters, bit for bit, which the tests check. Each sequence is
already random, so the loader does not shuffle and both ways see the same
batches.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpuq.runner as gq


def make_sequences(samples: int, length: int, vocab: int, seed: int) -> TensorDataset:
    """Random token sequences and, as targets, the same sequences reversed."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (samples, length), generator=gen)
    return TensorDataset(tokens, tokens.flip(1))


class Reverser(nn.Module):
    """Token and learned position embeddings, a transformer encoder, a per-position head."""

    def __init__(
        self, vocab: int, length: int, width: int, heads: int, layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(length, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, length, vocab)."""
        hidden: torch.Tensor = self.encoder(self.tokens(tokens) + self.positions)
        logits: torch.Tensor = self.head(hidden)
        return logits


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2048, help="training sequences")
    parser.add_argument("--length", type=int, default=12, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument("--width", type=int, default=64, help="model dimension")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=0, help="print the loss every N steps")
    parser.add_argument("--no-runner", action="store_true", help="make no gpuq.runner call")
    parser.add_argument("--out", help="save the final model and optimizer state here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, printing where it started and the accuracy after each epoch."""
    args = parse_args(argv)
    runner = not args.no_runner
    torch.manual_seed(args.seed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    job = gq.init() if runner else None  # a no-op handle outside gpuq
    train = make_sequences(args.samples, args.length, args.vocab, args.seed)
    test = make_sequences(512, args.length, args.vocab, args.seed + 1)
    model = Reverser(args.vocab, args.length, args.width, args.heads, args.layers, args.dropout)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)
    loss_fn = nn.CrossEntropyLoss()
    epochs: Iterable[int]
    loader: Iterable[list[torch.Tensor]]
    if job is not None:
        state = gq.State(model=model, optimizer=opt, lr_scheduler=sched)
        if state.restore():  # everything random was drawn above: nothing random below
            print(f"resumed from step {job.step} (epoch {job.epoch})", flush=True)
        loader = gq.AdaptiveDataLoader(train, batch_size=args.batch_size, shuffle=False)
        epochs = gq.epochs(args.epochs)
    else:  # a private generator: a plain DataLoader would otherwise draw from torch's
        loader = DataLoader(train, batch_size=args.batch_size, generator=torch.Generator())
        epochs = range(args.epochs)
    where = "-" if job is None or job.job_id is None else job.job_id
    print(f"job {where}: training on {device}", flush=True)

    steps = 0
    for epoch in epochs:
        model.train()  # before the inner loop: runs again when an epoch is resumed
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if job is not None:
                gq.step(loss=loss)  # may save and exit here, or park until resumed
            steps = job.step if job is not None else steps + 1
            if args.log_every and steps % args.log_every == 0:
                print(f"step {steps} loss {loss.item():.4f}", flush=True)
        sched.step()  # after the inner loop: once per epoch, resumed or not
        correct = accuracy(model, test, device)
        print(f"epoch {epoch}: step {steps}, test token accuracy {correct:.3f}", flush=True)

    if args.out:
        final = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": steps}
        torch.save(final, args.out)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    """Fraction of answer tokens predicted right (draws no random numbers)."""
    model.eval()
    tokens, reversed_tokens = (t.to(device) for t in data.tensors)
    return float((model(tokens).argmax(dim=-1) == reversed_tokens).float().mean())


if __name__ == "__main__":
    main()

"""Train a small MLP with gpuq.runner, so gpuq can suspend and resume it exactly.

The same kind of job as examples/mlp, written the way the runner wants it:
its state in a `gq.State`, its data in a `gq.AdaptiveDataLoader`, and
`gq.step()` at the end of every iteration. Under gpuq, SIGUSR1 (or a suspend
from the daemon) makes it save a checkpoint at the next step and exit with
code 75; started again, it continues from the next step as if nothing had
happened. Outside gpuq the runner does nothing and this is a plain script.
The data is generated from a fixed seed, so nothing is downloaded.

It also keeps state that lives outside the model and optimizer: the best
accuracy so far, its epoch, and the count of epochs without improvement that
``--patience`` stops on. They are in the `progress` dict given to the State,
which the checkpoint saves and `restore()` fills in place; kept in plain
variables, they would start from 0 on every resume and a resumed run would
stop later than an uninterrupted one. Steps are counted by ``job.step``,
which the checkpoint restores, never by a counter of the script's own.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq


def make_data(samples: int, features: int, classes: int, seed: int) -> TensorDataset:
    """Points around `classes` random centres, labelled by their centre."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 0.6
    labels = torch.randint(0, classes, (samples,), generator=gen)
    points = centres[labels] + torch.randn(samples, features, generator=gen)
    return TensorDataset(points, labels)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (gpuq only)"
    )
    parser.add_argument(
        "--patience", type=int, default=0, help="stop after N epochs without a better accuracy"
    )
    parser.add_argument("--deterministic", action="store_true", help="bitwise-reproducible ops")
    parser.add_argument("--out", help="save the final model, optimizer and scheduler state here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, printing where it started and the accuracy after each epoch."""
    args = parse_args(argv)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    job = gq.init()  # a no-op handle outside gpuq
    data = make_data(args.samples, 32, 10, args.seed)
    model = nn.Sequential(
        nn.Linear(32, args.hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(args.hidden, 10)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    loss_fn = nn.CrossEntropyLoss()
    # Outside the model and optimizer, yet needed to go on exactly: in the checkpoint too.
    progress = {"best_accuracy": 0.0, "best_epoch": -1, "epochs_without_gain": 0}
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched, progress=progress)
    if state.restore():  # everything random was drawn above: nothing random below
        print(f"resumed from step {job.step} (epoch {job.epoch})", flush=True)
    loader = gq.AdaptiveDataLoader(data, batch_size=args.batch_size, max_batch_size=1024)
    print(f"job {job.job_id or '-'}: training on {device}", flush=True)

    for epoch in gq.epochs(args.epochs):
        model.train()  # before the inner loop: runs again when an epoch is resumed
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)  # may save and exit here, or park until resumed
            if args.log_every and job.step % args.log_every == 0:
                print(f"step {job.step} loss {loss.item():.4f}", flush=True)
            if args.checkpoint_every and job.step % args.checkpoint_every == 0:
                if state.checkpoint_dir is not None:
                    state.save()
        sched.step()  # after the inner loop: once per epoch, resumed or not
        correct = accuracy(model, data, device)
        if correct > progress["best_accuracy"]:  # also after the inner loop: once per epoch
            progress.update(best_accuracy=correct, best_epoch=epoch, epochs_without_gain=0)
        else:
            progress["epochs_without_gain"] += 1
        best = f"best {progress['best_accuracy']:.3f} (epoch {progress['best_epoch']})"
        print(f"epoch {epoch}: step {job.step}, accuracy {correct:.3f}, {best}", flush=True)
        if args.patience and progress["epochs_without_gain"] >= args.patience:
            print(f"stopping: no better accuracy since epoch {progress['best_epoch']}", flush=True)
            break

    if args.out:
        final = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        final |= {"lr_scheduler": sched.state_dict(), "progress": progress}
        torch.save(final | {"step": job.step}, args.out)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    """Fraction of `data` classified right (draws no random numbers)."""
    model.eval()
    points, labels = (t.to(device) for t in data.tensors)
    return float((model(points).argmax(dim=1) == labels).float().mean())


if __name__ == "__main__":
    main()

"""torchrun/DDP: all ranks stop at the same step, exit 75, and resume exactly.

The end-to-end test runs examples/runner_ddp/train.py under a real
``torchrun --nproc-per-node 2`` (gloo, CPU) through
``python -m gpuq.runner.integrations.torchrun``. The first suspend is a
SIGUSR1 to rank 0 alone (as a control-channel request reaches only rank 0);
the second is a SIGUSR1 to the launcher's process group (as the daemon
signals a job), with agreement every 4 steps. Each time both ranks report
the same step, the launcher exits with 75, and the final parameters equal an
uninterrupted run's bit for bit. The ranks wait at the chosen step until the
signal is sent (tests/ddp_gated.py), so a slow test process on a loaded
machine cannot miss the training's end.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuq.runner import distributed
from gpuq.runner.data import AdaptiveDataLoader, _PositionedBatchSampler
from gpuq.runner.integrations import torchrun as torchrun_launcher
from gpuq.runner.job import Job, RunnerError
from gpuq.runner.tuning import BatchConfig, BatchTuner
from tests.daemon_harness import wait_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "runner_ddp" / "train.py"
GATED = Path(__file__).resolve().with_name("ddp_gated.py")
ARGS = ["--epochs", "3", "--samples", "1024", "--log-every", "1"]  # 16 steps an epoch, 48 in all

pytestmark = [pytest.mark.torch]


def test_torchrun_environment_names_rank_and_world_size() -> None:
    assert (distributed.rank({}), distributed.world_size({})) == (0, 1)
    assert distributed.is_coordinator({})
    environ = {"RANK": "3", "WORLD_SIZE": "4"}
    assert (distributed.rank(environ), distributed.world_size(environ)) == (3, 4)
    assert not distributed.is_coordinator(environ)


@pytest.mark.parametrize(
    ("uuids", "workers"), [("GPU-a,GPU-b,GPU-c", "3"), ("GPU-a", "1"), (None, "1")]
)
def test_nproc_per_node_gpuq_starts_one_worker_per_gpu_of_the_attempt(
    uuids: str | None, workers: str
) -> None:
    environ = {} if uuids is None else {"GPUQ_GPU_UUIDS": uuids}
    given = ["--nproc-per-node=gpuq", "--nnodes", "1", "train.py", "--epochs", "2"]
    assert torchrun_launcher.gpuq_workers(given, environ) == [
        f"--nproc-per-node={workers}", "--nnodes", "1", "train.py", "--epochs", "2",
    ]  # fmt: skip
    spaced = torchrun_launcher.gpuq_workers(["--nproc_per_node", "gpuq", "t.py"], environ)
    assert spaced == ["--nproc_per_node", workers, "t.py"]
    assert torchrun_launcher.gpuq_workers(["--nproc-per-node=2", "t.py"], environ)[0].endswith("2")


def test_park_is_refused_under_torchrun_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RunnerError) as refused:
        distributed.check_suspend_mode("park", {"WORLD_SIZE": "2"})
    assert refused.value.hint and "checkpoint" in refused.value.hint
    distributed.check_suspend_mode("checkpoint", {"WORLD_SIZE": "2"})
    distributed.check_suspend_mode("park", {"WORLD_SIZE": "1"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RunnerError, match="park mode is not supported"):
        Job(environ={}).request_suspend("park")


def test_agreement_interval_must_be_positive() -> None:
    with pytest.raises(RunnerError):
        distributed.configure(agree_every=0)


def test_without_a_process_group_agreement_is_the_local_request() -> None:
    job = Job(environ={})
    assert distributed.coordination_group() is None
    assert distributed.agree_on_suspend(job) is None
    job.request_suspend("checkpoint")
    assert distributed.agree_on_suspend(job) == "checkpoint"
    assert job.suspend_requested is None


@pytest.mark.parametrize(("size", "ranks"), [(10, 2), (11, 2), (10, 3), (7, 1)])
def test_shards_are_equal_strided_slices(size: int, ranks: int) -> None:
    dataset = list(range(size))
    for rank in range(ranks):
        shard = distributed.shard(dataset, {"RANK": str(rank), "WORLD_SIZE": str(ranks)})
        items = [shard[i] for i in range(len(shard))]
        assert items == list(range(rank, (size // ranks) * ranks, ranks))


@pytest.mark.parametrize(("count", "replicas"), [(32, 4), (33, 4), (7, 2), (5, 1)])
def test_a_batch_is_split_into_contiguous_near_equal_parts(count: int, replicas: int) -> None:
    parts = [distributed.replica_share(count, replicas, r) for r in range(replicas)]
    assert parts[0][0] == 0 and parts[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert max(e - s for s, e in parts) - min(e - s for s, e in parts) <= 1


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 4), (4, 1), (3, 2)])
def test_a_pass_resumed_on_another_number_of_ranks_takes_each_sample_once(
    before: int, after: int
) -> None:
    size, batch = 96, 24

    def ranks_from(start: int, replicas: int) -> list[list[int]]:
        samplers = []
        for rank in range(replicas):
            sampler = _PositionedBatchSampler(size, batch, True, 7, False, replicas, rank)
            sampler.start = start
            samplers.append(list(sampler))
        return [[i for part in parts for i in part] for parts in zip(*samplers, strict=True)]

    whole = ranks_from(0, 1)
    first, rest = ranks_from(0, before)[:2], ranks_from(2 * batch, after)
    assert [sorted(b) for b in first + rest] == [sorted(b) for b in whole]  # the same steps
    assert sorted(i for b in first + rest for i in b) == list(range(size))


def test_a_position_in_one_ranks_shard_cannot_resume_on_another_number_of_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    position = {"epoch": 0, "index": 8, "in_progress": True, "batch_size": 4}
    sharded = position | {"world": 2, "sharded": True}
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = AdaptiveDataLoader(list(range(16)), batch_size=4)
    loader.load_state_dict(position)  # a whole-dataset position fits any number
    with pytest.raises(RunnerError) as refused:
        loader.load_state_dict(sharded)
    assert "shard" in (refused.value.hint or "")


def test_a_resized_tuner_keeps_its_global_batch_until_it_can_choose(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tuner = BatchTuner(
        opt, Job(environ={}), init_batch_size=32, max_batch_size=128, lr_scaling="adascale"
    )
    assert tuner.config == BatchConfig(32, 0, 1)
    assert tuner.use_replicas(4) == 0  # no model yet: the same 32 samples a step
    assert (tuner.config, tuner.config.batch_size) == (BatchConfig(8, 0, 4), 32)
    state = tuner.state_dict()
    again = BatchTuner(
        opt, Job(environ={}), init_batch_size=32, max_batch_size=128, lr_scaling="adascale",
        replicas=3,
    )  # fmt: skip
    again.load_state_dict(state)
    assert again.config == BatchConfig(8, 0, 4)
    again.use_replicas(3)
    assert again.config == BatchConfig(11, 0, 3)  # at least the 32 samples: ceil(32 / 3)


def test_launcher_sees_a_suspend_only_in_this_attempts_acknowledgement(tmp_path: Path) -> None:
    environ = {"GPUQ_JOB_ID": "4", "GPUQ_CHECKPOINT_DIR": str(tmp_path), "GPUQ_ATTEMPT": "2"}
    assert not torchrun_launcher.suspended(environ)
    ack = tmp_path / "suspended.json"
    ack.write_text(json.dumps({"mode": "checkpoint", "attempt": 1}))
    assert not torchrun_launcher.suspended(environ)
    ack.write_text(json.dumps({"mode": "checkpoint", "attempt": 2}))
    assert torchrun_launcher.suspended(environ)
    assert not torchrun_launcher.suspended({k: v for k, v in environ.items() if k != "GPUQ_JOB_ID"})


def plain_environ(**gpuq: str) -> dict[str, str]:
    """This environment without GPUQ_* variables, plus `gpuq` (GPUQ_<KEY>=...), one thread."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    environ |= {"OMP_NUM_THREADS": "1"}
    return environ | {f"GPUQ_{key.upper()}": value for key, value in gpuq.items()}


class Launch:
    """One ``torchrun --nproc-per-node 2`` of the example, in a session of its own.

    With `gate_at`, every rank waits after printing that step until `open_gate()`
    (tests/ddp_gated.py), so a signal sent meanwhile always lands mid-training.
    """

    def __init__(
        self, log: Path, environ: dict[str, str], *extra: str, gate_at: int | None = None
    ) -> None:
        self.log = log
        self.gate = log.with_suffix(".gate")
        script = EXAMPLE
        if gate_at is not None:
            script = GATED
            environ = environ | {"GATE_STEP": str(gate_at), "GATE_FILE": str(self.gate)}
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuq.runner.integrations.torchrun",
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    str(script),
                    *ARGS,
                    *extra,
                ],
                env=environ,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def open_gate(self) -> None:
        self.gate.touch()

    def printed(self, pattern: str) -> re.Match[str] | None:
        """The first match of `pattern` in the log; fails fast if the launcher ended."""
        found = re.search(pattern, self.text(), re.MULTILINE)
        if found is None and self.process.poll() is not None:
            raise AssertionError(f"the launcher ended early:\n{self.text()}")
        return found

    def wait(self) -> int:
        return self.process.wait(timeout=240)

    def stop(self) -> None:
        """End the launcher if it still runs; SIGTERM first, so it ends its ranks too."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """Launches started by a test; whatever is left of them is stopped afterwards."""
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.stop()


def stopped_steps(text: str) -> dict[int, int]:
    """Rank -> the step it reported suspending at."""
    steps = {int(m[1]): int(m[2]) for m in re.finditer(r"rank (\d+) suspended at step (\d+)", text)}
    for step in re.findall(r"gpuq\.runner: suspended at step (\d+):", text):
        steps[0] = int(step)
    return steps


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(path)
    return loaded


def assert_bitwise_equal(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    assert expected["step"] == actual["step"]
    model_keys = expected["model"].keys()
    assert model_keys == actual["model"].keys() and len(model_keys) == 4
    assert all(torch.equal(expected["model"][k], actual["model"][k]) for k in model_keys)
    moments = [
        (a["momentum_buffer"], b["momentum_buffer"])
        for a, b in zip(
            expected["optimizer"]["state"].values(),
            actual["optimizer"]["state"].values(),
            strict=True,
        )
    ]
    assert len(moments) == 4 and all(torch.equal(a, b) for a, b in moments)


@pytest.mark.slow
def test_both_ranks_stop_at_the_same_step_and_resume_bitwise_equal(
    tmp_path: Path, launches: list[Launch]
) -> None:
    rng = random.Random(20241121)
    checkpoints = tmp_path / "ckpt"
    reference = Launch(tmp_path / "reference.log", plain_environ(), "--out", str(tmp_path / "a"))
    launches.append(reference)

    def attempt(number: int) -> dict[str, str]:
        return plain_environ(job_id="9", checkpoint_dir=str(checkpoints), attempt=str(number))

    # 1: SIGUSR1 to rank 0 alone; rank 1 learns of it only through the agreement.
    target = rng.randint(2, 12)
    first = Launch(tmp_path / "1.log", attempt(1), gate_at=target)
    launches.append(first)
    pid = wait_for(partial(first.printed, r"^rank 0 pid (\d+)"), timeout=120)[1]
    wait_for(partial(first.printed, rf"^step {target} "), timeout=120)
    os.kill(int(pid), signal.SIGUSR1)
    first.open_gate()
    assert first.wait() == 75, first.text()
    steps = stopped_steps(first.text())
    ack = json.loads((checkpoints / "suspended.json").read_text())
    assert steps == {0: ack["step"], 1: ack["step"]}
    assert ack["step"] > target and (ack["attempt"], ack["mode"]) == (1, "checkpoint")
    assert "generators differ" not in first.text()  # torch is seeded alike on every rank
    stopped = ack["step"]

    # 2: SIGUSR1 to the launcher's process group, as the daemon sends it; agree every 4 steps.
    target = stopped + rng.randint(1, 12)
    second = Launch(tmp_path / "2.log", attempt(2), "--agree-every", "4", gate_at=target)
    launches.append(second)
    wait_for(partial(second.printed, rf"^step {target} "), timeout=120)
    os.killpg(second.process.pid, signal.SIGUSR1)
    second.open_gate()
    assert second.wait() == 75, second.text()
    assert f"rank 0 resumed from step {stopped} " in second.text()
    assert f"rank 1 resumed from step {stopped} " in second.text()
    ack = json.loads((checkpoints / "suspended.json").read_text())
    assert stopped_steps(second.text()) == {0: ack["step"], 1: ack["step"]}
    assert ack["step"] > target and ack["step"] % 4 == 0 and ack["attempt"] == 2

    # 3: to the end.
    third = Launch(tmp_path / "3.log", attempt(3), "--out", str(tmp_path / "b"))
    launches.append(third)
    assert third.wait() == 0, third.text()
    assert f"rank 1 resumed from step {ack['step']} " in third.text()
    assert reference.wait() == 0, reference.text()
    assert "finished at step 48" in reference.text()
    assert_bitwise_equal(load(tmp_path / "a"), load(tmp_path / "b"))

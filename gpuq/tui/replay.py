"""Recorded daemon payloads for `gpuq top`: screenshots, benchmarks, snapshots.

`ReplaySource` implements `gpuq.tui.source.Source` over fixed documents
(the same JSON objects the daemon sends), so the app can be drawn without a
daemon, deterministically. `synthetic_lab` builds such documents for a lab
of any size from a seed: jobs in every state, packed and time-sliced GPUs,
foreign memory, utilization history and runner metrics; `synthetic_cluster`
the same over several servers, some of them down.
"""

from __future__ import annotations

import queue
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from gpuq.errors import DaemonUnavailable, NotFoundError
from gpuq.tui.source import Snapshot

GIB: Final = 1024**3
USERS: Final = ("ana", "bo", "chen", "dita", "eli")
NAMES: Final = ("bert-ft", "resnet50", "llama-lora", "vit-s16", "gpt2-small", "unet", "sweep")
_ACTION_STATES: Final = {
    "cancel": "cancelled",
    "hold": "held",
    "release": "queued",
    "retry": "queued",
    "suspend": "suspended",
    "resume": "running",
}


@dataclass
class Lab:
    """The documents of one recorded lab."""

    node: str
    jobs: list[dict[str, Any]]
    gpu_samples: list[dict[str, Any]]
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    metrics: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)


class _QueueStream:
    """Events put on a queue, until interrupted."""

    _END: Final = object()

    def __init__(self, events: queue.Queue[object]) -> None:
        self._events = events

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            item = self._events.get()
            if item is self._END:
                return
            if isinstance(item, dict):
                yield item

    def interrupt(self) -> None:
        self._events.put(self._END)


class _ListStream:
    """A fixed list of events."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self._events

    def interrupt(self) -> None:
        """Nothing blocks, so nothing to interrupt."""


class ReplaySource:
    """`Source` over a `Lab`; actions change the recorded jobs and are streamed back.

    With `down`, every request fails as if no daemon were running.
    """

    def __init__(self, lab: Lab, down: bool = False, metrics_supported: bool = True) -> None:
        self.lab = lab
        self.down = down
        self.metrics_supported = metrics_supported
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self._jobs = {job["id"]: job for job in lab.jobs}
        self._subscribers: list[queue.Queue[object]] = []

    def _check_up(self) -> None:
        if self.down:
            raise DaemonUnavailable("no gpuq daemon is running (replay)", "start one")

    def snapshot(self) -> Snapshot:
        """The recorded jobs and GPU samples."""
        self._check_up()
        return Snapshot(self.lab.node, list(self._jobs.values()), list(self.lab.gpu_samples))

    def gpus(self) -> dict[str, Any]:
        """The latest recorded GPU sample."""
        self._check_up()
        return self.lab.gpu_samples[-1]

    def show(self, job_id: int) -> dict[str, Any]:
        """One recorded job, its events and its latest metrics sample."""
        self._check_up()
        if job_id not in self._jobs:
            raise NotFoundError(f"no job {job_id}")
        samples = self.lab.metrics.get(job_id, [])
        return {
            "job": self._jobs[job_id],
            "events": self.lab.events.get(job_id, []),
            "metrics": samples[-1] if samples else None,
        }

    def jobs(self, ids: list[int]) -> list[dict[str, Any]]:
        """The recorded jobs of `ids`."""
        self._check_up()
        return [self._jobs[i] for i in ids if i in self._jobs]

    def metrics(self, job_id: int, since: float) -> list[dict[str, Any]] | None:
        """Recorded samples newer than `since` (None when metrics are switched off)."""
        self._check_up()
        if not self.metrics_supported:
            return None
        return [s for s in self.lab.metrics.get(job_id, []) if s["time"] > since]

    def act(self, method: str, ids: list[int], **extra: Any) -> list[dict[str, Any]]:
        """Apply an action to the recorded jobs and stream the changed jobs."""
        self._check_up()
        self.calls.append((method, tuple(ids)))
        results = []
        for job_id in ids:
            job = self._jobs.get(job_id)
            if job is None:
                results.append(
                    {"id": job_id, "ok": False, "message": f"no job {job_id}", "state": None}
                )
                continue
            changed = dict(job)
            if method == "priority":
                changed["priority"] = extra["priority"]
            else:
                changed["state"] = _ACTION_STATES[method]
            self._jobs[job_id] = changed
            for events in self._subscribers:
                events.put({"type": "job", "job": changed})
            results.append({"id": job_id, "ok": True, "message": "", "state": changed["state"]})
        return results

    def subscribe(self, topics: tuple[str, ...]) -> _QueueStream:
        """A stream of the jobs that actions change; ends when interrupted."""
        self._check_up()
        events: queue.Queue[object] = queue.Queue()
        self._subscribers.append(events)
        return _QueueStream(events)

    def logs(self, job_id: int, tail: int, follow: bool) -> _ListStream:
        """The recorded output of a job, as one event."""
        self._check_up()
        text = self.lab.logs.get(job_id, "")
        return _ListStream([{"data": text}] if text else [])

    def close(self) -> None:
        """End every subscription."""
        for events in self._subscribers:
            events.put(_QueueStream._END)


def _spec(job_id: int, name: str, user: str, gpus: int, gpu_mem: int | None) -> dict[str, Any]:
    return {
        "command": ["python", f"{name}.py", "--seed", str(job_id)],
        "cwd": f"/home/{user}/{name}",
        "name": name,
        "user": user,
        "gpus": gpus,
        "gpu_mem": gpu_mem,
        "gpu_mem_auto": False,
        "exclusive": False,
        "priority": 0,
        "after": [],
        "hold": False,
        "begin": None,
        "time_limit": None,
        "retries": 0,
        "output": "",
        "error": None,
        "signal": None,
        "notify": None,
        "array_index": None,
        "array_parallel": None,
    }


def _job(job_id: int, rng: random.Random, now: float, state: str) -> dict[str, Any]:
    name = rng.choice(NAMES)
    user = rng.choice(USERS)
    shared = rng.random() < 0.4
    gpus = 1 if shared else rng.choice((0, 1, 1, 2, 4))
    gpu_mem = rng.choice((4, 6, 8, 12)) * GIB if shared else None
    submit = now - rng.uniform(60, 86400)
    started = state not in ("queued", "held") and not (state == "cancelled" and rng.random() < 0.5)
    start = submit + rng.uniform(1, 600) if started else None
    ended = state in ("succeeded", "failed", "cancelled", "lost")
    end = (start or submit) + rng.uniform(30, 7200) if ended else None
    if end is not None and end > now:
        end = now - 1
    reason = {
        "queued": rng.choice(("waiting for 1 free GPU (0 free)", "waiting for job 3 (after ok)")),
        "held": "held by user",
        "running": "started",
        "suspended": "suspended by user",
        "succeeded": "exited with code 0",
        "failed": "exited with code 1",
        "cancelled": "cancelled by user",
        "lost": "its supervisor died",
    }.get(state, "")
    return {
        "id": job_id,
        "name": name,
        "user": user,
        "state": state,
        "reason": reason,
        "exit_code": {"succeeded": 0, "failed": 1}.get(state),
        "signal": None,
        "gpus": gpus,
        "gpu_mem": gpu_mem,
        "gpu_uuids": [],
        "gpu_mem_reserved": gpu_mem,
        "node": "gpu1" if started else "",
        "priority": rng.choice((0, 0, 0, 5, 10)),
        "submit_time": submit,
        "start_time": start,
        "end_time": end,
        "attempts": 1 if started else 0,
        "array_id": None,
        "array_index": None,
        "stdout": f"/var/lib/gpuq/logs/{job_id}.out" if started else "",
        "stderr": f"/var/lib/gpuq/logs/{job_id}.out" if started else "",
        "spec": _spec(job_id, name, user, gpus, gpu_mem),
    }


def _metrics(job_id: int, rng: random.Random, now: float, points: int) -> list[dict[str, Any]]:
    samples = []
    batch = 64
    for i in range(points):
        if i and i % 12 == 0 and batch < 512:
            batch *= 2
        step_seconds = 0.08 + batch / 2000 + rng.uniform(0, 0.01)
        efficiency = max(0.3, 1.0 - batch / 1500)
        samples.append(
            {
                "time": now - (points - i) * 5.0,
                "step": (i + 1) * 50,
                "epoch": i // 20,
                "step_seconds": step_seconds,
                "samples_per_second": batch / step_seconds,
                "batch_size": batch,
                "memory_min_bytes": int((1.5 + batch / 256) * GIB),
                "memory_peak_bytes": int((3.0 + batch / 64) * GIB),
                "goodput": batch / step_seconds * efficiency,
                "efficiency": efficiency,
            }
        )
    return samples


def _place(jobs: list[dict[str, Any]], n_gpus: int) -> dict[int, list[int]]:
    """Job ids per GPU index: whole jobs alone, shares packed, one suspended job time-sliced."""
    per_gpu: dict[int, list[int]] = {i: [] for i in range(n_gpus)}
    shared_room = {i: 80 * GIB for i in range(n_gpus)}
    idle = list(range(n_gpus))[::-1]
    time_sliced = False
    for job in jobs:
        if job["gpus"] == 0 or job["state"] not in ("running", "suspended"):
            continue
        if job["state"] == "suspended":
            busy = [i for i, held in per_gpu.items() if held]
            if not time_sliced and busy and job["gpu_mem"] is not None:
                per_gpu[busy[0]].append(job["id"])  # parked beside a running job
                time_sliced = True
            continue  # the others were checkpointed: they hold no GPU
        if job["gpu_mem"] is None:
            if len(idle) > n_gpus // 2 and job["gpus"] <= len(idle) - n_gpus // 2:
                for _ in range(job["gpus"]):
                    index = idle.pop()
                    per_gpu[index].append(job["id"])
                    shared_room[index] = 0
            continue
        packed = [
            i
            for i in range(n_gpus)
            if i not in idle and shared_room[i] >= job["gpu_mem"] and len(per_gpu[i]) < 3
        ]
        target = packed[0] if packed else (idle.pop() if idle else None)
        if target is not None:
            per_gpu[target].append(job["id"])
            shared_room[target] -= job["gpu_mem"]
    return per_gpu


def synthetic_lab(
    n_jobs: int = 40, n_gpus: int = 4, now: float = 1_800_000_000.0, seed: int = 7
) -> Lab:
    """A deterministic lab: `n_jobs` jobs in every state on `n_gpus` 80G fake GPUs."""
    return synthetic_cluster(n_jobs, {"gpu1": n_gpus}, now=now, seed=seed)


def synthetic_cluster(
    n_jobs: int = 40,
    gpus_per_node: Mapping[str, int] = MappingProxyType({"gpu1": 4}),
    down: Mapping[str, str] = MappingProxyType({}),
    now: float = 1_800_000_000.0,
    seed: int = 7,
) -> Lab:
    """A deterministic lab of several servers, the first the daemon's own.

    Each server of `gpus_per_node` has that many 80G fake GPUs, indexed from
    0; the others are its `[[cluster.servers]]`, and those in `down` (host:
    reason) are down: their GPUs are missing from the samples, and only
    jobs that ended ran there. Jobs are dealt to servers by id.
    """
    rng = random.Random(seed)
    nodes = list(gpus_per_node)
    up = [node for node in nodes if node not in down]
    weights = {"running": 3, "queued": 6, "held": 1, "suspended": 1, "succeeded": 4, "failed": 1}
    states = [s for s, w in weights.items() for _ in range(w)] + ["cancelled", "lost"]
    jobs = [_job(i + 1, rng, now, rng.choice(states)) for i in range(n_jobs)]
    for job in jobs:
        if job["node"]:
            live = job["state"] not in ("succeeded", "failed", "cancelled", "lost")
            pool = up if live else nodes
            job["node"] = pool[job["id"] % len(pool)]
    by_id = {job["id"]: job for job in jobs}
    samples: list[dict[str, Any]] = [
        {"gpus": [], "backend": "fake", "sampled_at": now - 30 + tick, "servers": []}
        for tick in range(30)
    ]
    first = 0
    for node in nodes:
        n_gpus = gpus_per_node[node]
        uuids = [
            f"GPU-{seed:04d}{first + i:04d}-0000-4000-8000-{first + i:012d}" for i in range(n_gpus)
        ]
        first += n_gpus
        if node in down:
            continue
        per_gpu = _place([job for job in jobs if job["node"] == node], n_gpus)
        for job in jobs:
            if job["node"] != node:
                continue
            job["gpu_uuids"] = [uuids[i] for i, held in per_gpu.items() if job["id"] in held]
            if job["state"] == "running" and not job["gpu_uuids"] and job["gpus"]:
                job.update(
                    state="queued", start_time=None, node="", reason="waiting for a free GPU"
                )
        for tick, sample in enumerate(samples):
            sample["gpus"].extend(_gpus_at(tick, node, uuids, per_gpu, by_id))
    for sample in samples:
        sample["servers"] = [_health(node, down.get(node), now) for node in nodes[1:]]
    lab = Lab(node=nodes[0], jobs=jobs, gpu_samples=samples)
    for job in jobs:
        job_id = job["id"]
        history = [{"time": job["submit_time"], "state": "queued", "reason": "submitted"}]
        if job["start_time"] is not None:
            history.append({"time": job["start_time"], "state": "running", "reason": "started"})
        if job["state"] not in ("queued", "running"):
            history.append(
                {"time": job["end_time"] or now - 5, "state": job["state"], "reason": job["reason"]}
            )
        lab.events[job_id] = history
        if job["state"] in ("running", "suspended") and job["gpus"]:
            lab.metrics[job_id] = _metrics(job_id, rng, now, 60)
            lab.logs[job_id] = "".join(
                f"epoch {e} step {e * 50} loss {2.5 / (e + 1):.3f}\n" for e in range(12)
            )
    return lab


def _gpus_at(
    tick: int,
    node: str,
    uuids: list[str],
    per_gpu: dict[int, list[int]],
    by_id: Mapping[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The GPU objects of one server at sample `tick`."""
    gpus = []
    for i, uuid in enumerate(uuids):
        job_ids = per_gpu[i]
        gpuq_mem = sum(by_id[j]["gpu_mem"] or 30 * GIB for j in job_ids)
        foreign = 6 * GIB if i % 5 == 3 else 0
        total = 80 * GIB
        gpuq_mem = min(gpuq_mem, total - foreign)
        busy = any(by_id[j]["state"] == "running" for j in job_ids)
        util = (55 + 40 * ((tick * (i + 3)) % 7) / 6) if busy else 0.0
        whole = any(by_id[j]["gpu_mem"] is None for j in job_ids)
        gpus.append(
            {
                "uuid": uuid,
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total": total,
                "memory_used": gpuq_mem + foreign,
                "utilization": util,
                "processes": [],
                "node": node,
                "parent_uuid": None,
                "link_group": "",
                "memory_gpuq": gpuq_mem,
                "memory_foreign": foreign,
                "memory_reserved": sum(by_id[j]["gpu_mem"] or 0 for j in job_ids),
                "memory_free": total - gpuq_mem - foreign,
                "jobs": sorted(job_ids),
                "mode": "whole" if whole else ("shared" if job_ids else "idle"),
            }
        )
    return gpus


def _health(host: str, down_reason: str | None, now: float) -> dict[str, Any]:
    """A server's entry of `servers` (as `gpuq.daemon.servers.Health.to_dict` writes it)."""
    if down_reason is not None:
        return {
            "host": host,
            "state": "down",
            "since": now - 300,
            "reason": down_reason,
            "node": None,
            "pid": None,
            "gpus": None,
            "last_answer": None,
        }
    return {
        "host": host,
        "state": "up",
        "since": now - 7200,
        "reason": None,
        "node": host,
        "pid": 4242,
        "gpus": None,
        "last_answer": now - 1,
    }

"""A head and one other server (gpu2) in network namespaces, for the multi-server tests.

The head's daemon runs inside the head's namespace with gpu2 in its config
and reaches gpu2's daemon through `ssh gpu2 gpuq bridge`
(tests/netns_harness.py). The head has two fake GPUs and gpu2 three, so a
3-GPU job can only run on gpu2. Root only: `head_and_gpu2` skips elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.netns_harness import GPUQ, THREE_GPUS, Lab, servers, skip_unless_possible


@dataclass
class Cluster:
    """The two servers' daemons and the namespaces they talk across."""

    net: Lab
    head: DaemonHarness
    gpu2: DaemonHarness

    def start_head(self, extra_env: dict[str, str] | None = None) -> None:
        """Start the head's daemon inside its namespace (its ssh sessions run there)."""
        with self.net.inside("head"):
            self.head.start(extra_env)

    def hosted_dir(self, job_id: int) -> Path:
        """The job's directory on gpu2, where gpu2's daemon runs it for the head."""
        return self.gpu2.state_dir / "hosted" / "head" / "jobs" / str(job_id)

    def remote_gpus(self) -> list[dict[str, object]]:
        """gpu2's GPUs as the head shows them."""
        gpus: list[dict[str, object]] = self.head.call("gpus")["gpus"]
        return [gpu for gpu in gpus if gpu["node"] == "gpu2"]


@contextlib.contextmanager
def head_and_gpu2(root: Path, hidden_on_gpu2: Path | None = None) -> Iterator[Cluster]:
    """Both daemons up, the head seeing gpu2's GPUs; everything stopped afterwards.

    With `hidden_on_gpu2`, gpu2's daemon runs in a mount namespace of its
    own with an empty tmpfs over that directory: what is below it exists on
    the head but not on gpu2 (a directory not shared between servers).
    """
    skip_unless_possible()  # before any daemon starts (gpu2's may need a mount namespace)
    gpu2_toml: dict[str, object] = {"gpus_toml": THREE_GPUS, "extra_toml": 'node_name = "gpu2"'}
    if hidden_on_gpu2 is not None:
        hidden_on_gpu2.mkdir(parents=True, exist_ok=True)
        mount = 'mount -t tmpfs gpuq-hidden "$0" && exec "$@"'
        gpu2_toml["prefix"] = ["unshare", "--mount", "--propagation", "private", "--"] + [
            "sh",
            "-c",
            mount,
            str(hidden_on_gpu2),
        ]
    with running_daemon(root / "gpu2", **gpu2_toml) as gpu2:
        head = DaemonHarness(root / "head", extra_toml='node_name = "head"')
        configs = {"head": head.config_path, "gpu2": gpu2.config_path}
        with servers(root / "net", ["head", "gpu2"], configs) as net:
            # A sync answers within its 1 s poll plus 2 s (the heartbeat) even on a loaded
            # machine; a server silent 5 s is down, so a cut is seen within about 8 s.
            with head.config_path.open("a") as config:
                config.write(
                    f'\n[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "2s"\n'
                    'heartbeat = "2s"\ndown_after = "5s"\n'
                    f'[[cluster.servers]]\nhost = "gpu2"\ncommand = "{GPUQ}"\n'
                )
            cluster = Cluster(net, head, gpu2)
            cluster.start_head()
            try:
                wait_for(lambda: len(cluster.remote_gpus()) == 3, what="gpu2's GPUs at the head")
                yield cluster
            finally:
                head.close()


@dataclass
class Lab3:
    """Three servers' daemons (head, gpu2, gpu3), each inside its own namespace."""

    net: Lab
    daemons: dict[str, DaemonHarness]

    @property
    def head(self) -> DaemonHarness:
        """The daemon users submit to."""
        return self.daemons["head"]

    def gpus_of(self, node: str) -> list[dict[str, object]]:
        """`node`'s GPUs as the head shows them."""
        gpus: list[dict[str, object]] = self.head.call("gpus")["gpus"]
        return [gpu for gpu in gpus if gpu["node"] == node]


@contextlib.contextmanager
def three_servers(root: Path, cluster_toml: str = "") -> Iterator[Lab3]:
    """Head (2 fake GPUs), gpu2 (3) and gpu3 (4), every daemon in its server's namespace.

    Unlike `head_and_gpu2`, the other servers' daemons (and so their jobs) run
    inside their own namespaces too: a job's part on gpu2 reaches a part on
    the head at the head's address, as on a real network. `cluster_toml`
    adds keys to the head's `[cluster]` section.
    """
    skip_unless_possible()
    four = THREE_GPUS.replace("count = 3", "count = 4")
    daemons = {
        "head": DaemonHarness(root / "head", extra_toml='node_name = "head"'),
        "gpu2": DaemonHarness(root / "gpu2", THREE_GPUS, 'node_name = "gpu2"'),
        "gpu3": DaemonHarness(root / "gpu3", four, 'node_name = "gpu3"'),
    }
    configs = {name: daemon.config_path for name, daemon in daemons.items()}
    with servers(root / "net", list(daemons), configs) as net:
        with daemons["head"].config_path.open("a") as config:
            config.write(
                f'\n[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "2s"\n'
                f'heartbeat = "2s"\ndown_after = "5s"\n{cluster_toml}\n'
                f'[[cluster.servers]]\nhost = "gpu2"\ncommand = "{GPUQ}"\n'
                f'[[cluster.servers]]\nhost = "gpu3"\ncommand = "{GPUQ}"\n'
            )
        lab = Lab3(net, daemons)
        try:
            for name in ("gpu2", "gpu3", "head"):
                with net.inside(name):
                    daemons[name].start()
            for name, count in (("gpu2", 3), ("gpu3", 4)):
                wait_for(partial(_has, lab, name, count), what=f"{name}'s GPUs at the head")
            yield lab
        finally:
            for daemon in daemons.values():
                daemon.close()


def _has(lab: Lab3, node: str, count: int) -> bool:
    return len(lab.gpus_of(node)) == count

"""Placement constraints on a real daemon: `gpuq submit --node`, `--exclude-node`, `--label`.

The daemon is `head` (two fake GPUs, `daemon.labels`), and its config names
one other server, gpu2, which ssh can never reach here (its GPUs are never
seen). So:

- a node that is neither head nor a configured server is refused, naming
  the known nodes, with `gpuq cluster add` as the hint; so is a label no
  node carries, with each node's labels;
- a job excluded from head waits for gpu2, saying so, while other jobs run
  on head's GPUs; one that asks for head (by name or by a label only head
  carries) runs there;
- a label added to head by a reload lets a job waiting for gpu2's label
  start on head at once;
- `#GPUQ --node` lines in a script set the constraint too, and the spec
  keeps it (`gpuq show --json`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, submit_cli, wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def cluster_toml(tmp_path: Path) -> str:
    """Config for head (labelled fast-disk) and for gpu2 (a100), which ssh never reaches."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host *\n  ProxyCommand false\n")
    return (
        'node_name = "head"\nlabels = ["fast-disk"]\n'
        f'[cluster]\nssh_config = "{ssh_config}"\nconnect_timeout = "1s"\n'
        '[[cluster.servers]]\nhost = "gpu2"\nlabels = ["a100"]\n'
    )


@pytest.fixture
def head(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path, extra_toml=cluster_toml(tmp_path)) as daemon:
        yield daemon


def refused(daemon: DaemonHarness, *args: str) -> subprocess.CompletedProcess[str]:
    result = daemon.cli("submit", *args, "--", "true")
    assert result.returncode == 2, result.stderr
    return result


def test_an_unknown_node_is_refused_naming_the_known_ones(head: DaemonHarness) -> None:
    result = refused(head, "--node", "gpu9")
    assert "unknown node gpu9: the known nodes are head, gpu2" in result.stderr
    assert "gpuq cluster add gpu9" in result.stderr

    assert "unknown node gpu7" in refused(head, "--exclude-node", "gpu7").stderr


def test_a_label_no_node_carries_is_refused_with_each_nodes_labels(head: DaemonHarness) -> None:
    result = refused(head, "--label", "h100")
    assert "no node carries label h100" in result.stderr
    assert "head (fast-disk), gpu2 (a100)" in result.stderr


def test_constraints_no_node_meets_are_refused(head: DaemonHarness) -> None:
    result = refused(head, "--node", "head", "--label", "a100")
    assert "no node meets the job's placement constraints" in result.stderr
    assert "head: no label a100" in result.stderr


def test_a_bad_node_name_is_refused_before_the_daemon_looks(head: DaemonHarness) -> None:
    assert (
        "--node: invalid name '-oProxyCommand=x'" in refused(head, "--node=-oProxyCommand=x").stderr
    )


def test_a_job_excluded_from_this_node_waits_for_the_other_while_jobs_run(
    head: DaemonHarness,
) -> None:
    elsewhere = submit_cli(head, "--exclude-node", "head", "--", *SLEEP)
    first = submit_cli(head, "--", *SLEEP)
    second = submit_cli(head, "--", *SLEEP)
    head.wait_state(first, "running")
    head.wait_state(second, "running")

    job = head.job(elsewhere)
    assert job["state"] == "queued"
    assert job["reason"].startswith("waiting for node gpu2 (")
    assert job["spec"]["exclude_nodes"] == ["head"]
    shown = head.cli("show", str(elsewhere)).stdout
    assert "waiting for node gpu2" in shown
    assert "  Placement:  not on head\n" in shown


def test_a_job_for_this_node_by_name_or_label_runs_here(head: DaemonHarness) -> None:
    by_name = submit_cli(head, "--node", "head,gpu2", "--", "true")
    by_label = submit_cli(head, "--label", "fast-disk", "--", "true")
    for job_id in (by_name, by_label):
        job = head.wait_state(job_id, "succeeded")
        assert job["node"] == "head"
    assert head.job(by_name)["spec"]["nodes"] == ["head", "gpu2"]


def test_a_cpu_only_job_for_another_node_waits(head: DaemonHarness) -> None:
    job_id = submit_cli(head, "--gpus", "0", "--node", "gpu2", "--", "true")
    reason = wait_for(lambda: head.job(job_id)["reason"] != "submitted" and head.job(job_id))
    assert reason["state"] == "queued"
    assert reason["reason"] == "runs only on gpu2; CPU-only jobs start on head only"


def test_a_label_given_to_this_node_by_a_reload_lets_a_waiting_job_start(
    tmp_path: Path, head: DaemonHarness
) -> None:
    job_id = submit_cli(head, "--label", "a100", "--", "true")
    wait_for(
        lambda: head.job(job_id)["reason"].startswith("waiting for node gpu2"),
        what="the job to wait for gpu2",
    )
    text = head.config_path.read_text()
    head.config_path.write_text(text.replace('labels = ["fast-disk"]', 'labels = ["a100"]'))
    reloaded = head.cli("daemon", "reload", "--json")
    assert reloaded.returncode == 0, reloaded.stderr
    assert "daemon.labels" in json.loads(reloaded.stdout)["applied"]
    assert head.wait_state(job_id, "succeeded")["node"] == "head"


def test_gpuq_directives_set_the_constraint(head: DaemonHarness) -> None:
    script = head.root / "job.sh"
    script.write_text("#!/bin/sh\n#GPUQ --exclude-node head\n#GPUQ --label a100\ntrue\n")
    job_id = submit_cli(head, str(script))
    spec = head.job(job_id)["spec"]
    assert (spec["exclude_nodes"], spec["labels"], spec["nodes"]) == (["head"], ["a100"], [])

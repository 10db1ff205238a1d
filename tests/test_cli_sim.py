"""`gpuq sim`: workloads, policies, the table and the JSON document, and errors.

See the docstrings of gpuq/cli/sim.py and gpuq/sim/run.py for the behaviour tested here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuq.cli.app import app
from gpuq.cli.sim import results_table
from gpuq.errors import UsageError
from gpuq.policies.registry import LIVE_POLICY_NAMES, POLICY_NAMES
from gpuq.sim.run import (
    WORKLOAD_HINT,
    SimSettings,
    policy_names,
    resolve_workload,
    run_policies,
)

TINY = """name,time,application,num_replicas,batch_size
a,0,cifar10,1,128
b,60,ncf,1,32768
c,120,cifar10,2,256
"""


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "tiny.csv"
    path.write_text(TINY)
    return str(path)


def sim(*args: str) -> Result:
    return CliRunner().invoke(app, ["sim", *args], prog_name="gpuq")


def test_json_has_the_average_jct_of_each_policy(tiny: str) -> None:
    result = sim("-p", "fifo", "-w", tiny, "--nodes", "2", "--gpus-per-node", "4", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1
    assert document["settings"]["nodes"] == 2
    fifo = document["results"]["fifo"]
    assert fifo["jobs"] == 3
    assert fifo["avg_jct"] > 0
    assert fifo["median_jct"] <= fifo["p99_jct"] <= fifo["makespan"]


def test_compare_prints_one_row_per_policy_in_order(tiny: str) -> None:
    result = sim("--policy", "tiresias", "--compare", "fifo", "-w", tiny, "--nodes", "2", "-j", "1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["policy", "avg", "JCT"]
    assert [line.split()[0] for line in lines[1:]] == ["tiresias", "fifo"]


def test_an_unknown_policy_exits_2_and_lists_the_known_ones(tiny: str) -> None:
    result = sim("--policy", "lottery", "--workload", tiny)
    assert result.exit_code == 2
    assert "unknown policy 'lottery'" in result.stderr
    assert ", ".join(POLICY_NAMES) in result.stderr
    assert result.stdout == ""


def test_help_names_every_policy_and_those_the_daemon_runs() -> None:
    result = CliRunner().invoke(app, ["sim", "--help"], prog_name="gpuq", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Policies: " + ", ".join(POLICY_NAMES) + ";" in text
    assert f"the daemon runs {', '.join(LIVE_POLICY_NAMES)} (scheduler.policy)" in text
    assert "gpuq is its default" in text


@pytest.mark.parametrize("command", ["sim", "replay"])
def test_help_lists_every_workload_form_the_error_hint_does(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], prog_name="gpuq", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert WORKLOAD_HINT.removeprefix("give ") in text
    for family in (
        "workload-1..4",
        "workload-0.5-1..4",
        "philly-1..4",
        "saturn-1..5",
        "gen:",
        "lab:",
    ):
        assert family in text


def test_a_policy_variant_runs_beside_its_default_under_its_own_name(tiny: str) -> None:
    result = sim("-p", "gpuq", "--compare", "gpuq:starts=free", "-w", tiny, "-j", "1", "--json")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["results"]) == ["gpuq", "gpuq:starts=free"]


def test_an_unknown_policy_option_exits_2_and_lists_the_options(tiny: str) -> None:
    result = sim("--policy", "gpuq:fast=true", "--workload", tiny)
    assert result.exit_code == 2
    assert "policy 'gpuq' has no option fast" in result.stderr
    listed = result.stderr.split("its options: ", 1)[1].strip().split(", ")
    assert listed == sorted(listed)
    assert {"fair_grace", "moves", "packing", "quantum", "starts", "timeslice"} <= set(listed)
    assert "seed" not in listed


def test_errors_are_json_on_stderr_with_json(tiny: str) -> None:
    result = sim("--compare", "fifo,lottery", "--workload", tiny, "--json")
    assert result.exit_code == 2
    assert json.loads(result.stderr)["error"]["code"] == "invalid"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "fifo", "-w", "no-such-file.csv"], "no workload file or bundled workload"),
        (["-p", "fifo", "-w", "gen:x"], "bad generated workload"),
        (["-p", "fifo", "-w", "gen:-1"], "the seed must be 0 or more"),
        (["-p", "fifo", "-w", "lab:1:tuned:nan"], "the load must be in (0, 100], got nan"),
        (["-p", "fifo", "-w", "gen:1:1e308"], "the load must be in (0, 100]"),
        (["-p", "fifo", "-w", "workload-1", "--interval", "nan"], "--interval must be a positive"),
        (["-p", "fifo", "-w", "workload-1", "--interval", "inf"], "--interval must be a positive"),
        (["-p", "fifo", "-w", "workload-1", "--restart-penalty", "inf"], "0 or more, got inf"),
        (["-p", "fifo", "-w", "workload-1", "--seed", "-5"], "--seed must be 0 or more"),
        (["-w", "workload-1"], "no policy given"),
        (["-p", "fifo", "-w", "workload-1", "--nodes", "0"], "--nodes"),
        (["-p", "fifo", "-w", "workload-1", "--gpus-per-node", "100000"], "1600000 GPUs is past"),
        (["-p", "fifo", "-w", "workload-1", "--nodes", "5000"], "20000 GPUs is past"),
        (["-p", "fifo", "-w", "workload-1", "--interference", "1"], "--interference"),
        (["-p", "fifo", "-w", "workload-1", "--jobs", "0"], "--jobs"),
        (["-p", "sia", "-w", "workload-1", "--cluster", "sia", "--nodes", "4"], "cannot go with"),
        (["-p", "sia", "-w", "workload-1", "--cluster", "nope"], "no cluster file or bundled"),
    ],
)
def test_bad_arguments_exit_2_with_a_hint(args: list[str], message: str) -> None:
    result = sim(*args)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        ("gen:1", 20),  # 160 jobs scaled to 8 of 64 GPUs
        ("gen:1:0.5", 10),
        ("gen:1:realistic", 20),
        ("gen:2:realistic:2", 40),
        ("workload-1", 160),
        ("workload-0.5-1", 80),
    ],
)
def test_workload_specs(spec: str, count: int) -> None:
    assert len(resolve_workload(spec, gpus=8, gpus_per_node=4)) == count


def test_a_file_is_read_as_a_workload(tiny: str) -> None:
    assert [job.name for job in resolve_workload(tiny, 8, 4)] == ["a", "b", "c"]


def test_policy_names_keep_order_and_drop_repeats() -> None:
    assert policy_names("tiresias", "fifo, tiresias,optimus,") == ["tiresias", "fifo", "optimus"]
    with pytest.raises(UsageError, match="unknown policy"):
        policy_names(None, "fifo,nope")


def test_the_table_formats_seconds_percentages_and_milliseconds() -> None:
    summary = {
        "avg_jct": 2089.4,
        "median_jct": 900.0,
        "p99_jct": 20000.0,
        "makespan": 30000.0,
        "gpu_utilization": 0.8125,
        "avg_rho": 1.234,
        "max_rho": 4.5,
        "reallocations": 12,
        "decision_time_mean": 0.0123,
    }
    lines = results_table({"pollux": summary, "odd": {}}).splitlines()
    assert lines[1].split() == [
        "pollux", "2089", "900", "20000", "30000", "81.2%", "1.23", "4.50", "12", "12.30"
    ]  # fmt: skip
    assert lines[2].split() == ["odd", *["-"] * 9]


def test_policies_run_in_worker_processes_give_the_same_results(tiny: str) -> None:
    workload = resolve_workload(tiny, 8, 4)
    settings = SimSettings(nodes=2, gpus_per_node=4)
    parallel = run_policies(["fifo", "srtf"], workload, settings, 2)
    serial = run_policies(["fifo", "srtf"], workload, settings, 1)
    assert list(parallel) == ["fifo", "srtf"]
    for name in serial:
        for key in ("avg_jct", "p99_jct", "reallocations"):
            assert parallel[name][key] == serial[name][key]


def test_the_command_tree_loads_the_simulator_only_when_sim_runs() -> None:
    probe = (
        "import sys, gpuq.cli.app; heavy = ('numpy', 'scipy', 'gpuq.sim', 'gpuq.goodput'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_mixed_cluster_runs_each_job_on_its_types_tables(tiny: str) -> None:
    result = sim("-p", "sia", "-w", tiny, "--cluster", "phoebe", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["settings"]["cluster"] == (
        "3x8 RTX2080Ti + 2x8 A100 + 1x4 RTX6000 (44 GPUs, sia tables)"
    )
    assert document["results"]["sia"]["jobs"] == 3


@pytest.mark.parametrize(
    ("args", "cluster"),
    [
        ([], "1x8 T4 (8 GPUs, pollux tables)"),  # the server the lab workload is drawn for
        (["--nodes", "16"], "16x4 T4 (64 GPUs, pollux tables)"),
        (["--gpus-per-node", "4"], "16x4 T4 (64 GPUs, pollux tables)"),
        (["--cluster", "pollux"], "16x4 T4 (64 GPUs, pollux tables)"),
    ],
)
def test_a_lab_workload_runs_on_one_server_of_8_unless_told_otherwise(
    args: list[str], cluster: str
) -> None:
    result = sim("-p", "fifo", "-w", "lab:1", *args, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"]["cluster"] == cluster


def test_user_copies_give_each_user_a_row_of_jobs_jct_and_gpu_time(tiny: str) -> None:
    result = sim(
        "-p", "fifo", "-w", tiny, "--nodes", "1", "--gpus-per-node", "2",
        "--user-copies", "heavy=3,light=1", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    users = json.loads(result.stdout)["results"]["fifo"]["users"]
    assert {name: row["jobs"] for name, row in users.items()} == {"heavy": 9, "light": 3}
    assert sum(row["gpu_share"] for row in users.values()) == pytest.approx(1.0)
    table = sim(
        "-p", "fifo", "-w", tiny, "--nodes", "1", "--gpus-per-node", "2",
        "--user-copies", "heavy=3,light=1",
    )  # fmt: skip
    assert table.exit_code == 0, table.output
    assert ["POLICY", "USER", "JOBS", "AVG", "JCT", "GPU", "TIME"] in [
        line.split() for line in table.stdout.splitlines()
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--users", "a=1", "--user-copies", "a=1"], "use one"),
        (["--user-copies", "a=1.5"], "whole numbers"),
        (["--shares", "a=0"], "more than 0"),
        (["--shares", "a=1"], "--shares names a, who owns no job of the workload"),
        (["--users", "a=1", "--shares", "b=2"], "owns no job of the workload (its users: a)"),
        (["--users", "a=0"], "gives no user a weight above 0"),
        (["--users", "a=nan"], "bad user entry 'a=nan'"),
        (["--user-copies", "a=0"], "one above 0"),
        (["--max-gpus-per-user", "-1"], "0 (no limit) or more"),
    ],
)
def test_bad_lab_options_exit_2_with_the_reason(tiny: str, args: list[str], message: str) -> None:
    result = sim("-p", "fifo", "-w", tiny, "--nodes", "1", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_cluster_file_past_what_the_simulator_models_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text('[[nodes]]\ntype = "T4"\ngpus = 4096\ncount = 4\n')
    result = sim("-p", "fifo", "-w", "workload-1", "--cluster", str(big))
    assert result.exit_code == 2
    assert "a cluster of 16384 GPUs is past what gpuq sim models: 8192 at most" in result.stderr

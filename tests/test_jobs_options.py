"""`gpuq submit` options, end to end: the real CLI against a real daemon.

Each test submits through `gpuq submit` (so the option parser is covered),
lets the daemon run the job on two fake 40G GPUs, and checks what the job
saw (its environment, printed to its log) or what the daemon did with it.
Jobs that would run long are gated on files the test creates, or cancelled.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from tests.daemon_harness import DaemonHarness, listed, running_daemon, wait_for
from tests.daemon_harness import submit_cli as submit

GIB = 1024**3
ENDED = ("succeeded", "failed", "cancelled", "lost")


def job_env(daemon: DaemonHarness, job_id: int) -> dict[str, str]:
    """The environment a finished `env` job printed, read back with `gpuq logs`."""
    out = daemon.cli("logs", str(job_id))
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def gpu_uuids(daemon: DaemonHarness) -> list[str]:
    """The UUIDs of the daemon's GPUs, by index."""
    result = daemon.cli("gpus", "--json")
    assert result.returncode == 0, result.stderr
    return [gpu["uuid"] for gpu in json.loads(result.stdout)["gpus"]]


def cancel(daemon: DaemonHarness, *job_ids: int) -> None:
    """Cancel jobs and wait until they have ended."""
    result = daemon.cli("cancel", *map(str, job_ids))
    assert result.returncode == 0, result.stderr
    for job_id in job_ids:
        daemon.wait_state(job_id, "cancelled")


def cli_with_env(
    daemon: DaemonHarness, extra_env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `gpuq ARGS` with extra variables in the submitting shell's environment."""
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env={**daemon.env, **extra_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=daemon.root,
    )


# -- GPUs and the job's environment ------------------------------------------


def test_a_cpu_job_gets_no_gpu_and_starts_while_gpus_are_busy(daemon: DaemonHarness) -> None:
    busy = [submit(daemon, "--", "sleep", "30") for _ in range(2)]
    for job_id in busy:
        daemon.wait_state(job_id, "running")
    cpu_job = submit(daemon, "--gpus", "0", "--", "env")
    job = daemon.wait_state(cpu_job, "succeeded")
    assert job["gpus"] == 0
    assert job["gpu_uuids"] == []
    seen = job_env(daemon, cpu_job)
    assert seen["CUDA_VISIBLE_DEVICES"] == ""
    assert seen["GPUQ_GPU_UUIDS"] == ""
    assert "GPUQ_GPU_MEM" not in seen
    cancel(daemon, *busy)


def test_a_gpu_job_sees_its_gpus_by_uuid_and_the_gpuq_contract(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "2", "--name", "envdump", "--", "env")
    job = daemon.wait_state(job_id, "succeeded")
    assert job["name"] == "envdump"
    assert sorted(job["gpu_uuids"]) == sorted(gpu_uuids(daemon))
    seen = job_env(daemon, job_id)
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(job["gpu_uuids"])
    assert seen["GPUQ_GPU_UUIDS"] == ",".join(job["gpu_uuids"])
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["GPUQ_JOB_ID"] == str(job_id)
    assert seen["GPUQ_JOB_NAME"] == "envdump"
    assert seen["GPUQ_ATTEMPT"] == "1"
    assert "GPUQ_GPU_MEM" not in seen  # whole GPUs
    assert "GPUQ_ARRAY_INDEX" not in seen
    assert [j["name"] for j in listed(daemon, "--all")] == ["envdump"]


def test_the_default_name_is_the_commands_base_name(daemon: DaemonHarness) -> None:
    plain = submit(daemon, "--gpus", "0", "--hold", "--", "/bin/sh", "-c", "cd /tmp && true")
    assert daemon.job(plain)["name"] == "sh"
    named = submit(daemon, "--gpus", "0", "--hold", "-n", "mine", "--", "true")
    assert daemon.job(named)["name"] == "mine"


def test_a_shared_gpu_job_sees_its_memory_share(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpu-mem", "10G", "--", "env")
    job = daemon.wait_state(job_id, "succeeded")
    assert job["gpu_mem_reserved"] == 10 * GIB
    seen = job_env(daemon, job_id)
    assert seen["GPUQ_GPU_MEM"] == str(10 * GIB)
    assert seen["CUDA_VISIBLE_DEVICES"] == job["gpu_uuids"][0]


def test_the_submitting_shells_environment_reaches_the_job_and_env_overrides_it(
    daemon: DaemonHarness,
) -> None:
    shell = {"GPUQ_TEST_FROM_SHELL": "captured", "GPUQ_TEST_OVERRIDDEN": "old"}
    result = cli_with_env(
        daemon,
        shell,
        "submit",
        "-q",
        "--gpus",
        "0",
        "--env",
        "GPUQ_TEST_OVERRIDDEN=new",
        "-E",
        "GPUQ_TEST_ADDED=a=b",
        "--env",
        "CUDA_VISIBLE_DEVICES=0",
        "--",
        "env",
    )
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    daemon.wait_state(job_id, "succeeded")
    seen = job_env(daemon, job_id)
    assert seen["GPUQ_TEST_FROM_SHELL"] == "captured"
    assert seen["GPUQ_TEST_OVERRIDDEN"] == "new"
    assert seen["GPUQ_TEST_ADDED"] == "a=b"
    assert seen["CUDA_VISIBLE_DEVICES"] == ""  # the GPUQ contract wins over --env


def test_an_environment_too_large_to_send_is_refused_naming_its_largest_variables(
    daemon: DaemonHarness,
) -> None:
    # Nine variables of 120 kB: over the daemon's 1 MiB per request, each under exec's limit.
    shell = {f"GPUQ_TEST_BIG_{n}": str(n) * (120_000 + n) for n in range(9)}
    result = cli_with_env(daemon, shell, "submit", "--gpus", "0", "--", "true")
    assert result.returncode == 2
    assert "the job is too large to submit" in result.stderr
    assert "largest variables are GPUQ_TEST_BIG_8 (120008 bytes), GPUQ_TEST_BIG_7" in result.stderr
    assert "env -u GPUQ_TEST_BIG_8 gpuq submit" in result.stderr
    assert daemon.call("list")["jobs"] == []


def test_a_job_submitted_from_inside_a_job_does_not_inherit_its_gpuq_variables(
    daemon: DaemonHarness,
) -> None:
    inside_a_job = {
        "GPUQ_JOB_ID": "999",
        "GPUQ_ARRAY_ID": "990",
        "GPUQ_ARRAY_INDEX": "9",
        "GPUQ_GPU_MEM": "1024",
        "GPUQ_CONTROL_SOCKET": "/nonexistent/control.sock",
        "CUDA_VISIBLE_DEVICES": "GPU-of-the-parent",
    }
    result = cli_with_env(daemon, inside_a_job, "submit", "-q", "--", "env")
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    job = daemon.wait_state(job_id, "succeeded")
    seen = job_env(daemon, job_id)
    assert seen["GPUQ_JOB_ID"] == str(job_id)
    assert seen["CUDA_VISIBLE_DEVICES"] == job["gpu_uuids"][0]
    for name in ("GPUQ_ARRAY_ID", "GPUQ_ARRAY_INDEX", "GPUQ_GPU_MEM"):
        assert name not in seen, name
    assert seen["GPUQ_CONTROL_SOCKET"].endswith(f"/{job_id}.sock")  # its own, not the parent's
    assert seen["GPUQ_CONFIG"] == str(daemon.config_path)  # gpuq inside reaches this daemon


def test_a_gpu_range_makes_an_adaptive_job_that_fifo_runs_on_its_minimum(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, extra_toml='[scheduler]\npolicy = "fifo"\n') as daemon:
        job_id = submit(daemon, "--gpus", "1-2", "--", "sleep", "30")
        job = daemon.wait_state(job_id, "running")
        assert (job["gpus"], job["gpus_max"], len(job["gpu_uuids"])) == (1, 2, 1)
        assert job["spec"]["gpus_max"] == 2
        row = daemon.cli("ls").stdout.splitlines()[1].split()
        assert row[3] == "1/1-2"  # holds 1 of 1-2
        cancel(daemon, job_id)


def test_impossible_gpu_ranges_are_usage_errors(daemon: DaemonHarness) -> None:
    for text, message in [
        ("4-2", "a range needs 1 <= MIN <= MAX"),
        ("0-2", "a range needs 1 <= MIN <= MAX"),
        ("one", "--gpus needs a count or a range"),
        ("1-99999", "at most 4096 GPUs"),
    ]:
        result = daemon.cli("submit", "--gpus", text, "--", "true")
        assert result.returncode == 2, text
        assert message in result.stderr, result.stderr
    shares = daemon.cli("submit", "--gpus", "1-2", "--gpu-mem", "1G", "--", "true")
    assert "a GPU range takes them whole" in shares.stderr
    assert listed(daemon, "--all") == []


def test_env_without_an_equals_sign_is_a_usage_error(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "--env", "JUSTAKEY", "--", "true")
    assert result.returncode == 2
    assert "--env needs KEY=VALUE" in result.stderr
    assert listed(daemon, "--all") == []


def test_cwd_sets_the_jobs_working_directory(daemon: DaemonHarness) -> None:
    (daemon.root / "work" / "here").mkdir(parents=True)
    in_subdir = submit(daemon, "--gpus", "0", "--cwd", "work/here", "--", "pwd")
    default = submit(daemon, "--gpus", "0", "--", "pwd")
    daemon.wait_state(in_subdir, "succeeded")
    daemon.wait_state(default, "succeeded")
    assert daemon.cli("logs", str(in_subdir)).stdout == f"{daemon.root / 'work' / 'here'}\n"
    assert daemon.cli("logs", str(default)).stdout == f"{daemon.root}\n"


def test_a_missing_cwd_is_refused_at_submission(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "--cwd", "no/such/dir", "--", "true")
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert listed(daemon, "--all") == []


# -- ordering and readiness --------------------------------------------------


def test_higher_priority_starts_first_when_a_gpu_frees_up(daemon: DaemonHarness) -> None:
    fillers = [submit(daemon, "--", "sleep", "30") for _ in range(2)]
    for job_id in fillers:
        daemon.wait_state(job_id, "running")
    low = submit(daemon, "--name", "low", "--priority", "-5", "--", "sleep", "30")
    high = submit(daemon, "--name", "high", "-p", "10", "--", "sleep", "30")
    assert daemon.job(low)["state"] == daemon.job(high)["state"] == "queued"
    cancel(daemon, fillers[0])
    daemon.wait_state(high, "running")
    low_job = daemon.job(low)
    assert low_job["state"] == "queued"
    assert low_job["priority"] == -5
    assert "waiting for 1 free GPU" in low_job["reason"]
    cancel(daemon, fillers[1], high, low)


def test_after_ok_any_and_notok(daemon: DaemonHarness) -> None:
    ok = submit(daemon, "--gpus", "0", "--", "true")
    bad = submit(daemon, "--gpus", "0", "--", "sh", "-c", "exit 1")
    daemon.wait_state(ok, "succeeded")
    daemon.wait_state(bad, "failed")
    cases = {
        f"{ok}": "succeeded",
        f"{ok}:ok": "succeeded",
        f"{bad}": "cancelled",
        f"{bad}:any": "succeeded",
        f"{ok}:any": "succeeded",
        f"{bad}:notok": "succeeded",
        f"{ok}:notok": "cancelled",
        f"{ok},{bad}:any": "succeeded",
        f"{ok},{bad}": "cancelled",
    }
    submitted = {dep: submit(daemon, "--gpus", "0", "--after", dep, "--", "true") for dep in cases}
    for dep, expected in cases.items():
        job = daemon.wait_state(submitted[dep], *ENDED)
        assert job["state"] == expected, (dep, job)
        if expected == "cancelled":
            assert "can never be satisfied" in job["reason"], job["reason"]
            assert job["start_time"] is None
    assert daemon.job(submitted[f"{ok},{bad}"])["spec"]["after"] == [f"{ok}:ok", f"{bad}:ok"]


def test_a_dependent_job_waits_until_its_dependency_ends(daemon: DaemonHarness) -> None:
    first = submit(daemon, "--gpus", "0", "--hold", "--", "true")
    second = submit(daemon, "--gpus", "0", "-d", str(first), "--", "true")
    waiting = wait_for(
        lambda: (job := daemon.job(second))["reason"].startswith("waiting for") and job,
        what="a waiting reason",
    )
    assert waiting["state"] == "queued"
    assert waiting["reason"] == f"waiting for job {first} (ok)"
    assert daemon.cli("release", str(first)).returncode == 0
    daemon.wait_state(second, "succeeded")
    assert daemon.job(first)["state"] == "succeeded"


def test_after_an_unknown_job_is_refused(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "--after", "42", "--", "true")
    assert result.returncode == 3
    assert "no job or array 42" in result.stderr
    bad = daemon.cli("submit", "--after", "x:sometimes", "--", "true")
    assert bad.returncode == 2
    assert "bad dependency" in bad.stderr


def test_array_runs_at_most_the_limit_at_once_and_names_outputs(daemon: DaemonHarness) -> None:
    # Each task waits for its own release file, so the test decides when tasks end.
    task = (
        "echo index=$GPUQ_ARRAY_INDEX array=$GPUQ_ARRAY_ID job=$GPUQ_JOB_ID; "
        "while [ ! -e release-$GPUQ_ARRAY_INDEX ]; do sleep 0.05; done"
    )
    result = daemon.cli(
        "submit",
        "--json",
        "--gpus",
        "0",
        "--array",
        "0-5%2",
        "--output",
        "task-%A-%a-%j.out",
        "--",
        "sh",
        "-c",
        task,
    )
    assert result.returncode == 0, result.stderr
    submitted = json.loads(result.stdout)
    ids, array_id = submitted["ids"], submitted["array_id"]
    assert len(ids) == 6
    assert array_id == ids[0] - 1, "the array's own id comes just before its tasks'"
    index_of = {job_id: n for n, job_id in enumerate(ids)}
    finished: set[int] = set()

    def running(expected: int) -> list[dict[str, Any]] | None:
        jobs = listed(daemon, "--all")
        assert all(j["array_id"] == array_id for j in jobs)
        active = [j for j in jobs if j["state"] in ("starting", "running")]
        assert len(active) <= 2, active
        return active if len(active) == expected else None

    while len(finished) < 6:
        expected = min(2, 6 - len(finished))
        active = wait_for(partial(running, expected), what=f"{expected} tasks to run")
        for job in listed(daemon):
            if job["state"] == "queued":
                assert job["reason"] == "array limit: 2 tasks at a time"
        ending = active[0]["id"]
        (daemon.root / f"release-{index_of[ending]}").touch()
        daemon.wait_state(ending, "succeeded")
        finished.add(ending)

    for job_id, index in index_of.items():
        job = daemon.job(job_id)
        assert job["array_index"] == index
        assert job["array_id"] == array_id
        out = daemon.root / f"task-{array_id}-{index}-{job_id}.out"
        assert out.read_text() == f"index={index} array={array_id} job={job_id}\n"
        assert job["stdout"] == str(out)


def test_hold_keeps_a_job_until_release(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--hold", "--", "true")
    job = daemon.job(job_id)
    assert job["state"] == "held"
    assert job["reason"] == "held at submission"
    assert [j["id"] for j in listed(daemon, "--state", "held")] == [job_id]
    released = daemon.cli("release", str(job_id))
    assert released.returncode == 0, released.stderr
    assert released.stdout == f"job {job_id}: queued\n"
    daemon.wait_state(job_id, "succeeded")


def test_begin_waits_with_a_reason_then_starts(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--begin", "now+2s", "--", "true")
    job = daemon.job(job_id)
    begin = job["spec"]["begin"]
    assert job["state"] == "queued"
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(begin))
    waiting = wait_for(lambda: (j := daemon.job(job_id))["reason"] != "submitted" and j)
    assert waiting["reason"] == f"begins at {shown}"
    assert waiting["state"] == "queued"
    done = daemon.wait_state(job_id, "succeeded")
    assert done["start_time"] >= begin


def test_time_limit_kills_the_job_with_a_reason(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--time", "2s", "--", "sleep", "60")
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert job["reason"] == "time limit of 2s reached"
    assert job["signal"] == "SIGTERM"
    assert job["exit_code"] == 143
    assert job["spec"]["time_limit"] == 2


def test_signal_is_delivered_before_the_time_limit(daemon: DaemonHarness) -> None:
    script = (
        "trap 'echo usr1 >> signals' USR1; "
        "trap 'echo term >> signals; exit 143' TERM; "
        "while true; do sleep 0.1; done"
    )
    job_id = submit(
        daemon, "--gpus", "0", "--signal", "USR1@1", "--time", "3s", "--", "sh", "-c", script
    )
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert "time limit" in job["reason"]
    assert (daemon.root / "signals").read_text() == "usr1\nterm\n"


def test_retries_rerun_a_failing_job_until_it_succeeds(daemon: DaemonHarness) -> None:
    counting = (
        "n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; "
        'echo "attempt $GPUQ_ATTEMPT"; [ $n -ge 3 ]'
    )
    job_id = submit(daemon, "--gpus", "0", "--retries", "2", "--", "sh", "-c", counting)
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "succeeded"
    assert job["attempts"] == 3
    assert job["exit_code"] == 0
    assert daemon.cli("logs", str(job_id)).stdout == "attempt 1\nattempt 2\nattempt 3\n"
    reasons = [
        e["reason"] for e in json.loads(daemon.cli("show", "--json", str(job_id)).stdout)["events"]
    ]
    assert "exited with code 1; retrying in 1s (attempt 2 of 3)" in reasons
    assert "exited with code 1; retrying in 2s (attempt 3 of 3)" in reasons


def test_retries_run_out(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "-r", "1", "--", "sh", "-c", "exit 4")
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert job["attempts"] == 2
    assert job["exit_code"] == 4


# -- output files and notification ------------------------------------------


def test_output_and_error_patterns(daemon: DaemonHarness) -> None:
    job_id = submit(
        daemon,
        "--gpus",
        "0",
        "--name",
        "pat",
        "--output",
        "logs/%x-%j.out",
        "--error",
        "logs/%x-%j.err",
        "--",
        "sh",
        "-c",
        "echo to-stdout; echo to-stderr >&2",
    )
    job = daemon.wait_state(job_id, "succeeded")
    out = daemon.root / "logs" / f"pat-{job_id}.out"
    err = daemon.root / "logs" / f"pat-{job_id}.err"
    assert (job["stdout"], job["stderr"]) == (str(out), str(err))
    assert out.read_text() == "to-stdout\n"
    assert err.read_text() == "to-stderr\n"
    assert daemon.cli("logs", str(job_id)).stdout == "to-stdout\n"
    assert daemon.cli("logs", "--stderr", str(job_id)).stdout == "to-stderr\n"


def test_output_alone_takes_both_streams(daemon: DaemonHarness) -> None:
    job_id = submit(
        daemon, "--gpus", "0", "-o", "both-%j.log", "--", "sh", "-c", "echo out; echo err >&2"
    )
    job = daemon.wait_state(job_id, "succeeded")
    path = daemon.root / f"both-{job_id}.log"
    assert job["stdout"] == job["stderr"] == str(path)
    assert sorted(path.read_text().splitlines()) == ["err", "out"]


def test_an_unknown_output_placeholder_is_refused(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "--output", "out-%q.log", "--", "true")
    assert result.returncode == 2
    assert "unknown placeholder %q" in result.stderr


def test_notify_runs_with_the_final_state(daemon: DaemonHarness) -> None:
    notify = 'echo "$GPUQ_JOB_STATE $GPUQ_JOB_EXIT_CODE" > notified-$GPUQ_JOB_ID'
    good = submit(daemon, "--gpus", "0", "--notify", notify, "--", "true")
    bad = submit(daemon, "--gpus", "0", "--notify", notify, "--", "sh", "-c", "exit 6")
    paths = [daemon.root / f"notified-{job_id}" for job_id in (good, bad)]
    wait_for(lambda: all(p.exists() and p.read_text() for p in paths), what="notifications")
    assert [p.read_text() for p in paths] == ["succeeded 0\n", "failed 6\n"]


# -- what submit prints and returns ------------------------------------------


def test_wait_exits_with_the_jobs_exit_code(daemon: DaemonHarness) -> None:
    failing = daemon.cli("submit", "--gpus", "0", "--wait", "--", "sh", "-c", "exit 3")
    assert failing.returncode == 3
    assert re.fullmatch(r"Submitted job \d+\n", failing.stdout)
    job_id = int(failing.stdout.split()[-1])
    assert daemon.job(job_id)["state"] == "failed"
    passing = daemon.cli("submit", "--gpus", "0", "-W", "--", "true")
    assert passing.returncode == 0
    assert daemon.job(int(passing.stdout.split()[-1]))["state"] == "succeeded"


def test_parsable_prints_only_the_id(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "-q", "--gpus", "0", "--", "true")
    assert result.returncode == 0
    assert re.fullmatch(r"\d+\n", result.stdout)
    assert result.stderr == ""
    daemon.wait_state(int(result.stdout), "succeeded")


def test_json_prints_the_schema_version_and_ids(daemon: DaemonHarness) -> None:
    single = daemon.cli("submit", "--json", "--gpus", "0", "--", "true")
    assert single.returncode == 0, single.stderr
    first = json.loads(single.stdout)
    assert first == {"schema_version": 1, "ids": [first["ids"][0]], "array_id": None}
    array = daemon.cli("submit", "--json", "--gpus", "0", "--array", "1,3,5", "--", "true")
    ids = json.loads(array.stdout)["ids"]
    assert json.loads(array.stdout)["array_id"] == first["ids"][0] + 1
    assert ids == [first["ids"][0] + 2, first["ids"][0] + 3, first["ids"][0] + 4]
    for job_id, index in zip(ids, (1, 3, 5), strict=True):
        assert daemon.wait_state(job_id, "succeeded")["array_index"] == index


def test_json_errors_go_to_stderr_as_json(daemon: DaemonHarness) -> None:
    result = daemon.cli("submit", "--json", "--gpus", "3", "--", "true")
    assert result.returncode == 5
    assert result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "resources"
    assert error["exit_code"] == 5
    assert "this server has 2" in error["message"]


def test_environment_is_not_leaked_by_ls_json(daemon: DaemonHarness) -> None:
    result = cli_with_env(
        daemon, {"GPUQ_TEST_SECRET": "hunter2"}, "submit", "-q", "--hold", "--", "true"
    )
    assert result.returncode == 0, result.stderr
    listing = daemon.cli("ls", "--json")
    assert "hunter2" not in listing.stdout
    assert "env" not in json.loads(listing.stdout)["jobs"][0]["spec"]

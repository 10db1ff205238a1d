"""Job scripts with `#GPUQ` directives, submitted through the real CLI.

`gpuq submit job.sh ARGS` reads the `#GPUQ` lines at the top of the script
as submit options; options on the command line win over them. An executable
script runs as is; a non-executable one through its shebang's interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonHarness

SCRIPT = """\
#!/bin/sh
# report what the job was given
#GPUQ --gpus 0 --name scripted
#GPUQ --priority 3   # directives may carry comments
echo "name=$GPUQ_JOB_NAME gpus=$GPUQ_GPU_UUIDS args=$*"
#GPUQ --name ignored-after-the-first-command
"""


def write_script(root: Path, name: str, text: str, executable: bool) -> Path:
    """Write a job script into the test's directory."""
    path = root / name
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)
    return path


def submitted(daemon: DaemonHarness, *args: str) -> dict[str, Any]:
    """Submit with `gpuq submit -q ARGS`, wait for the job to end, return it."""
    result = daemon.cli("submit", "-q", *args)
    assert result.returncode == 0, result.stderr
    return daemon.wait_state(int(result.stdout), "succeeded", "failed", "cancelled")


def no_jobs(daemon: DaemonHarness) -> bool:
    """True when no job was ever submitted."""
    jobs: list[dict[str, Any]] = json.loads(daemon.cli("ls", "--all", "--json").stdout)["jobs"]
    return not jobs


@pytest.mark.parametrize("executable", [True, False], ids=["executable", "shebang"])
@pytest.mark.parametrize("invocation", ["job.sh", "./job.sh"])
def test_directives_set_the_options_and_arguments_reach_the_script(
    daemon: DaemonHarness, executable: bool, invocation: str
) -> None:
    write_script(daemon.root, "job.sh", SCRIPT, executable)
    job = submitted(daemon, invocation, "--lr", "3")
    assert job["state"] == "succeeded", daemon.cli("logs", "--stderr", str(job["id"])).stdout
    assert (job["name"], job["gpus"], job["priority"]) == ("scripted", 0, 3)
    assert job["gpu_uuids"] == []
    assert daemon.cli("logs", str(job["id"])).stdout == "name=scripted gpus= args=--lr 3\n"


def test_a_script_without_a_name_directive_is_named_after_the_file(daemon: DaemonHarness) -> None:
    text = "#!/bin/sh\n#GPUQ --gpus 0\necho ran\n"
    for name, executable in (("exec.sh", True), ("plain.sh", False)):
        write_script(daemon.root, name, text, executable)
        job = submitted(daemon, name, "an-argument")
        assert job["state"] == "succeeded"
        assert job["name"] == name


def test_command_line_options_override_directives(daemon: DaemonHarness) -> None:
    write_script(daemon.root, "job.sh", SCRIPT, executable=True)
    job = submitted(daemon, "--name", "from-cli", "--gpus", "1", "--", "./job.sh")
    assert job["state"] == "succeeded"
    assert job["name"] == "from-cli"
    assert job["gpus"] == 1
    assert len(job["gpu_uuids"]) == 1
    assert job["priority"] == 3  # not given on the command line: the directive holds
    assert daemon.cli("logs", str(job["id"])).stdout == (
        f"name=from-cli gpus={job['gpu_uuids'][0]} args=\n"
    )


def test_a_script_elsewhere_runs_from_the_jobs_working_directory(daemon: DaemonHarness) -> None:
    (daemon.root / "scripts").mkdir()
    (daemon.root / "data").mkdir()
    text = "#!/bin/sh\n#GPUQ --gpus 0 --cwd data\npwd\n"
    for name, executable in (("scripts/exec.sh", True), ("scripts/plain.sh", False)):
        write_script(daemon.root, name, text, executable)
        job = submitted(daemon, name)
        assert job["state"] == "succeeded", daemon.cli("logs", "--stderr", str(job["id"])).stdout
        assert daemon.cli("logs", str(job["id"])).stdout == f"{daemon.root / 'data'}\n"


@pytest.mark.parametrize(
    ("name", "executable", "message"),
    [
        ("train.py", False, "train.py is a Python script without a #! line"),
        ("train.py", True, "train.py is a Python script without a #! line"),
        ("job.sh", True, "job.sh is executable but has no #! line"),
    ],
)
def test_a_script_that_would_not_run_without_a_shebang_is_refused(
    daemon: DaemonHarness, name: str, executable: bool, message: str
) -> None:
    write_script(daemon.root, name, "import sys\nprint(sys.argv)\n", executable)
    result = daemon.cli("submit", name)
    assert result.returncode == 2
    assert message in result.stderr and "hint:" in result.stderr
    assert no_jobs(daemon)


def test_a_plain_shell_script_without_a_shebang_runs_under_sh(daemon: DaemonHarness) -> None:
    write_script(daemon.root, "job.sh", "#GPUQ --gpus 0\necho plain\n", executable=False)
    job_id = int(daemon.cli("submit", "-q", "job.sh").stdout)
    daemon.wait_state(job_id, "succeeded")
    assert daemon.cli("logs", str(job_id)).stdout == "plain\n"


def test_a_script_with_windows_line_endings_is_refused_at_submit(daemon: DaemonHarness) -> None:
    (daemon.root / "job.sh").write_bytes(b"#!/bin/sh\r\n#GPUQ --gpus 0\r\necho hi\r\n")
    result = daemon.cli("submit", "job.sh")
    assert result.returncode == 2
    assert "job.sh has Windows line endings (CRLF)" in result.stderr
    assert "hint: convert it first: dos2unix job.sh" in result.stderr
    assert no_jobs(daemon)


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("#GPUQ --gpus two", "--gpus needs a count or a range, got 'two'"),
        ("#GPUQ --gpu 2", "unknown option '--gpu'"),
        ('#GPUQ --name "unclosed', "cannot split #GPUQ directive"),
        ("#GPUQ --gpus 0 train.py", "#GPUQ directives take options only, got 'train.py'"),
    ],
    ids=["bad-value", "unknown-option", "unbalanced-quote", "not-an-option"],
)
def test_a_bad_directive_is_a_clear_error(
    daemon: DaemonHarness, directive: str, message: str
) -> None:
    write_script(daemon.root, "job.sh", f"#!/bin/sh\n{directive}\ntrue\n", executable=True)
    result = daemon.cli("submit", "job.sh")
    assert result.returncode == 2
    assert message in result.stderr
    assert "job.sh" in result.stderr  # the error names the script
    assert "line 2" in result.stderr  # and the directive's line
    assert no_jobs(daemon)

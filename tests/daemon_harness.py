"""A real gpuq daemon in a temporary state and runtime directory, for tests.

`DaemonHarness` writes a config with fake GPUs, starts `python -m
gpuq.daemon` as a real process, and offers a connected client, a way to run
the real CLI against it, and `wait_for` (poll with a timeout, never a bare
sleep). On teardown it stops the daemon and kills every job process left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuq.client import Client
from gpuq.config import Config, load_config
from gpuq.daemon import jobfiles

FAKE_TWO_GPUS = """
[[gpus.fake]]
name = "Fake A100"
memory = "40G"
count = 2
"""


def wait_for(
    condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


class DaemonHarness:
    """One daemon under test; see the module docstring."""

    def __init__(self, root: Path, gpus_toml: str = FAKE_TWO_GPUS, extra_toml: str = "") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # Unix socket paths are limited to ~107 bytes: keep the runtime dir short.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gq-"))
        self.state_dir = root / "state"
        self.config_path = root / "config.toml"
        self.config_path.write_text(
            f'[daemon]\nstate_dir = "{self.state_dir}"\nruntime_dir = "{self.runtime_dir}"\n'
            f'kill_grace = "2s"\n{extra_toml}\n{gpus_toml}\n'
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Config:
        """The loaded configuration of this daemon."""
        return load_config(str(self.config_path))

    @property
    def env(self) -> dict[str, str]:
        """Environment for CLI subprocesses that talk to this daemon."""
        return {**os.environ, "GPUQ_CONFIG": str(self.config_path)}

    def start(
        self, extra_env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start the daemon (after `prefix`, a wrapper command) and wait until it answers."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.state_dir / "daemon-test.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "gpuq.daemon", "--config", str(self.config_path)],
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **(extra_env or {})},
        )
        log.close()
        process = self.process

        def answers() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"daemon exited with {process.returncode}:\n{self.log()}")
            try:
                Client.connect(self.config, autostart=False).close()
            except Exception:  # noqa: BLE001 - any failure means "not yet"
                return False
            return True

        wait_for(answers, what="the daemon to answer")
        return process

    def log(self) -> str:
        """The daemon's log so far."""
        path = self.state_dir / "daemon-test.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the daemon (jobs survive under their shims)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """Stop the daemon gracefully if it runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self) -> Client:
        """A fresh connected client (the caller closes it)."""
        return Client.connect(self.config, autostart=False)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One request on a fresh connection."""
        with self.client() as client:
            result: dict[str, Any] = client.call(method, **params)
        return result

    def submit(self, command: list[str], **spec: Any) -> int:
        """Submit one job (cwd: the test root) and return its id."""
        full = {"command": command, "cwd": str(self.root), "env": dict(os.environ), **spec}
        full.setdefault("name", Path(command[0]).name)
        return int(self.call("submit", spec=full)["ids"][0])

    def job(self, job_id: int) -> dict[str, Any]:
        """The job object of `job_id`."""
        job: dict[str, Any] = self.call("show", id=job_id)["job"]
        return job

    def wait_state(self, job_id: int, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the job is in one of `states`; returns the job."""
        return dict(
            wait_for(
                lambda: (job := self.job(job_id))["state"] in states and job,
                timeout=timeout,
                what=f"job {job_id} to be {'/'.join(states)}",
            )
        )

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real `gpuq` command against this daemon."""
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
        )

    def kill_jobs(self) -> None:
        """Kill every job process and shim this daemon ever started."""
        hosted = self.state_dir / "hosted"  # attempts run for other servers' daemons
        job_dirs = [
            job_dir
            for jobs_dir in [self.state_dir / "jobs", *hosted.glob("*/jobs")]
            if jobs_dir.is_dir()
            for job_dir in jobs_dir.iterdir()
        ]
        for job_dir in job_dirs:
            for name in (jobfiles.CHILD, jobfiles.SHIM):
                record = jobfiles.read_json(job_dir / name)
                if jobfiles.is_same_process(record):
                    assert record is not None
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        if name == jobfiles.CHILD:
                            os.killpg(int(record["pgid"]), signal.SIGKILL)
                        else:
                            os.kill(int(record["pid"]), signal.SIGKILL)

    def close(self) -> None:
        """Stop everything and remove the runtime directory."""
        self.stop()
        self.kill_jobs()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def submit_cli(daemon: DaemonHarness, *args: str) -> int:
    """`gpuq submit -q ARGS` through the real CLI; returns the new job's id."""
    result = daemon.cli("submit", "-q", *args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def listed(daemon: DaemonHarness, *args: str) -> list[dict[str, Any]]:
    """The jobs of `gpuq ls --json ARGS` through the real CLI."""
    result = daemon.cli("ls", "--json", *args)
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)["jobs"]
    return jobs


@contextlib.contextmanager
def running_daemon(root: Path, **kwargs: Any) -> Iterator[DaemonHarness]:
    """Start a daemon for the duration of a `with` block."""
    prefix = kwargs.pop("prefix", ())
    harness = DaemonHarness(root, **kwargs)
    try:
        harness.start(prefix=prefix)
        yield harness
    finally:
        harness.close()


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `mount_point` (made here) with `options`; skips unless root."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)

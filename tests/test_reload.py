"""Config changes apply on `gpuq daemon reload` and SIGHUP, and a forgotten edit is flagged.

Live keys (scheduler, logs, defaults, client, daemon.kill_grace) change at
once; others (the daemon's directories, the GPUs) are reported as needing a
restart, and `gpuq ls` and `gpuq doctor` keep warning until then. An invalid
file changes nothing.
"""

from __future__ import annotations

import json
import os
import signal

from gpuq.client import Client
from gpuq.daemon import reload
from tests.daemon_harness import DaemonHarness, wait_for
from tests.daemon_harness import submit_cli as submit


def append(daemon: DaemonHarness, toml: str) -> None:
    """Add settings to the daemon's config file (a new section, or keys of the last one)."""
    daemon.config_path.write_text(daemon.config_path.read_text() + f"\n{toml}\n")


def test_an_edit_not_yet_applied_is_flagged_by_ls_and_doctor(daemon: DaemonHarness) -> None:
    assert "config file" not in daemon.cli("ls").stderr
    append(daemon, '[logs]\nmax_size = "2G"')
    listing = daemon.cli("ls")
    assert listing.returncode == 0
    assert listing.stderr == (
        f"gpuq: warning: the config file {daemon.config_path} changed since the daemon read "
        "it: gpuq daemon reload applies logs.max_size\n"
    )
    doctor = daemon.cli("doctor")
    assert "[FAIL] daemon" in doctor.stdout and "gpuq daemon reload" in doctor.stdout
    reloaded = daemon.cli("daemon", "reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert "logs.max_size" in reloaded.stdout
    assert "config file" not in daemon.cli("ls").stderr


def test_an_edit_of_the_defaults_alone_needs_no_reload_and_is_not_warned_of(
    daemon: DaemonHarness,
) -> None:
    """Each `gpuq submit` reads [defaults] from the file: the edit counts at once."""
    append(daemon, '# the usual limit\n[defaults]\ntime_limit = "1s"')
    assert daemon.cli("ls").stderr == ""
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    assert daemon.wait_state(job_id, "failed", timeout=30)["reason"] == "time limit of 1s reached"


def test_an_edit_that_needs_a_restart_says_so_before_the_reload(daemon: DaemonHarness) -> None:
    append(daemon, '[[gpus.fake]]\nname = "Extra"\nmemory = "8G"')
    assert daemon.cli("ls").stderr == (
        f"gpuq: warning: the config file {daemon.config_path} changed since the daemon read "
        "it: gpus.fake take effect only after gpuq daemon restart\n"
    )
    reloaded = daemon.cli("daemon", "reload")
    assert reloaded.returncode == 0
    assert reloaded.stdout.endswith(": nothing to apply now\n")
    assert reloaded.stderr == "gpuq: gpus.fake take effect after gpuq daemon restart\n"


def test_an_edit_that_no_longer_validates_is_warned_of(daemon: DaemonHarness) -> None:
    """Commands refuse the file themselves; a client such as `gpuq top` hears it from the daemon."""
    config = daemon.config  # read while it is valid
    append(daemon, '[logs]\nmax_size = "huge"')
    with Client.connect(config, autostart=False) as client:
        (warning,) = client.call("status")["warnings"]
    assert warning.startswith(
        f"the config file {daemon.config_path} changed since the daemon read it and is not "
        f"valid (invalid logs.max_size = 'huge' in {daemon.config_path}"
    )
    assert warning.endswith("); the daemon goes on with what it read")


def test_reload_applies_live_keys_to_new_jobs(daemon: DaemonHarness) -> None:
    append(daemon, '[defaults]\ntime_limit = "1s"')
    result = json.loads(daemon.cli("daemon", "reload", "--json").stdout)
    assert (result["applied"], result["restart_needed"]) == (["defaults.time_limit"], [])
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    job = daemon.wait_state(job_id, "failed", timeout=30)
    assert job["reason"] == "time limit of 1s reached"


def test_sighup_reloads_like_the_command(daemon: DaemonHarness) -> None:
    append(daemon, '[defaults]\ntime_limit = "1s"')
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGHUP)
    wait_for(lambda: "config file" not in daemon.cli("ls").stderr, what="the reload")
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    assert daemon.wait_state(job_id, "failed", timeout=30)["reason"] == "time limit of 1s reached"


def test_keys_that_need_a_restart_are_reported_and_kept_warning(daemon: DaemonHarness) -> None:
    append(daemon, '[[gpus.fake]]\nname = "Extra"\nmemory = "8G"')
    reloaded = daemon.cli("daemon", "reload", "--json")
    assert reloaded.returncode == 0, reloaded.stderr
    assert json.loads(reloaded.stdout)["restart_needed"] == ["gpus.fake"]
    assert len(json.loads(daemon.cli("gpus", "--json").stdout)["gpus"]) == 2, "not applied"
    assert "gpus.fake changed and take effect only after gpuq daemon restart" in (
        daemon.cli("ls").stderr
    )


def test_an_edit_undone_before_the_restart_stops_the_warning(daemon: DaemonHarness) -> None:
    good = daemon.config_path.read_text()
    append(daemon, '[[gpus.fake]]\nname = "Extra"\nmemory = "8G"')
    assert json.loads(daemon.cli("daemon", "reload", "--json").stdout)["restart_needed"] == [
        "gpus.fake"
    ]
    daemon.config_path.write_text(good)
    undone = daemon.cli("daemon", "reload", "--json")
    assert json.loads(undone.stdout)["restart_needed"] == []
    assert daemon.cli("ls").stderr == ""


def test_an_invalid_file_changes_nothing(daemon: DaemonHarness) -> None:
    good = daemon.config_path.read_text()
    append(daemon, '[scheduler]\npolicy = "no-such-policy"')
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGHUP)  # the CLI itself would refuse to read the file
    wait_for(lambda: "config not reloaded" in daemon.log(), what="the refused reload")
    assert "no-such-policy" in daemon.log()
    daemon.config_path.write_text(good)
    assert "config file" not in daemon.cli("ls").stderr, "it still runs what it read first"
    job_id = submit(daemon, "--gpus", "0", "--", "true")
    assert daemon.wait_state(job_id, "succeeded")


def test_the_reload_command_reports_an_invalid_file_without_a_traceback(
    daemon: DaemonHarness,
) -> None:
    daemon.config_path.write_text(daemon.config_path.read_text().replace("2s", "soon"))
    reloaded = daemon.cli("daemon", "reload")
    assert reloaded.returncode != 0
    assert "kill_grace" in reloaded.stderr and "Traceback" not in reloaded.stderr


def test_live_and_restart_keys_are_split_by_section() -> None:
    live = ["scheduler.policy", "logs.max_size", "defaults.time_limit", "client.timeout"]
    assert all(reload._is_live(key) for key in [*live, "daemon.kill_grace"])
    restart = ["daemon.state_dir", "daemon.runtime_dir", "gpus.fake"]
    assert not any(reload._is_live(key) for key in restart)

"""`gpuq --version`, and what `gpuq doctor` says about GPUs without NVML and about the policy.

Declared fake GPUs need no NVML, so doctor does not warn about it; with
`backend = "fake"` and none declared, it says to declare some (not to set
the backend it already has).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gpuq
from gpuq.cli import doctor
from gpuq.config import load_config
from gpuq.wire import PROTOCOL_VERSION


def gpuq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_gpuqs_and_the_protocols_version(flag: str) -> None:
    result = gpuq_cli(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"gpuq {gpuq.__version__} (protocol {PROTOCOL_VERSION})\n"


def gpu_check(tmp_path: Path, toml: str) -> doctor.Check:
    config_file = tmp_path / "config.toml"
    config_file.write_text(toml)
    return doctor.check_nvml(load_config(str(config_file)))


def test_declared_fake_gpus_need_no_nvml(tmp_path: Path) -> None:
    check = gpu_check(tmp_path, '[[gpus.fake]]\nname = "Fake"\nmemory = "8G"\ncount = 2\n')
    assert (check.status, check.message) == ("ok", "2 fake GPU(s) declared; NVML is not used")


def test_the_fake_backend_without_gpus_asks_for_declared_gpus(tmp_path: Path) -> None:
    check = gpu_check(tmp_path, '[gpus]\nbackend = "fake"\n')
    assert check.status == "warn"
    assert "no fake GPUs declared" in check.message
    assert "[[gpus.fake]]" in check.hint and 'backend = "fake"' not in check.hint


def test_without_nvml_and_without_fake_gpus_doctor_offers_both_ways(tmp_path: Path) -> None:
    check = gpu_check(tmp_path, "")
    if check.status == "ok":
        pytest.skip("NVML sees GPUs on this machine")
    assert check.status == "warn" and "CPU-only jobs" in check.message
    assert "driver" in check.hint and "[[gpus.fake]]" in check.hint


def test_doctor_names_the_policy_and_which_policies_run_live(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text('[scheduler]\npolicy = "fifo"\n')
    check = doctor.check_policy(load_config(str(config_file)))
    assert check.status == "ok"
    assert check.message.startswith(
        "fifo (the daemon runs: fifo, tiresias, pollux, gandiva, gpuq; "
        "gpuq sim also: srtf, srsf, optimus,"
    )


def test_doctor_says_when_the_policy_is_the_default_gpuq(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text("")
    check = doctor.check_policy(load_config(str(config_file)))
    assert check.message.startswith("gpuq (the default) (the daemon runs: fifo,")


def test_doctor_fails_the_config_check_on_a_simulator_only_policy(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text('[scheduler]\npolicy = "ones"\n')
    [check] = doctor.run_checks(str(config_file))
    assert (check.name, check.status) == ("config", "fail")
    assert "invalid scheduler.policy = 'ones'" in check.message
    assert "runs only in the simulator so far" in check.hint

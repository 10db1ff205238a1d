"""Shared fixtures: a real daemon process on temporary directories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    """A started daemon with two fake 40G GPUs; stopped (jobs killed) afterwards."""
    with running_daemon(tmp_path) as harness:
        yield harness

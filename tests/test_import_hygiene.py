"""Import contracts checked at run time, in fresh interpreters.

import-linter checks the static graph (pyproject.toml); these check what a
real process actually loads on the paths that must stay light.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "numpy", "scipy", "textual", "pynvml")


def loaded_modules(code: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after `code`."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return {name.split(".")[0] for name in json.loads(out.splitlines()[-1])}


@pytest.mark.parametrize(
    ("code", "forbidden"),
    [
        ("import gpuq", (*HEAVY, "typer", "asyncio", "sqlite3")),
        ("import gpuq.models, gpuq.protocol, gpuq.env, gpuq.errors", (*HEAVY, "typer")),
        ("import gpuq.gpus, gpuq.gpus.nvml, gpuq.gpus.fake", (*HEAVY, "typer")),
        ("import gpuq.policies.fifo", (*HEAVY, "typer", "asyncio", "sqlite3")),
    ],
)
def test_light_modules_import_nothing_heavy(code: str, forbidden: tuple[str, ...]) -> None:
    assert loaded_modules(code).isdisjoint(forbidden)


def test_the_submit_path_imports_no_typer_and_nothing_heavy() -> None:
    code = (
        "import gpuq.cli.entry, gpuq.cli.submit, gpuq.client, gpuq.config, gpuq.units, "
        "gpuq.directives"
    )
    assert loaded_modules(code).isdisjoint((*HEAVY, "typer", "click", "rich", "sqlite3"))

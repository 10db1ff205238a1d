"""`gpuq top`'s import boundaries, checked in fresh interpreters.

Textual is loaded only when `gpuq top` runs; the pure layer of the TUI loads
no Textual at all; the TUI as a whole never loads the daemon, SQLite, NVML
or torch (import-linter checks the same statically, pyproject.toml).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_modules(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after `code`."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.parametrize(
    "code",
    [
        "import gpuq.tui",
        "import gpuq.tui.model, gpuq.tui.gpumodel, gpuq.tui.series",
        "import gpuq.tui.main",
        "import gpuq.cli.app",  # every command but `top` stays without Textual
    ],
)
def test_textual_is_loaded_only_by_the_app(code: str) -> None:
    assert "textual" not in top_level(loaded_modules(code))


def test_the_tui_loads_no_daemon_database_nvml_or_torch() -> None:
    modules = loaded_modules("import gpuq.tui.app, gpuq.tui.replay, gpuq.tui.source")
    assert "textual" in top_level(modules)
    assert top_level(modules).isdisjoint({"sqlite3", "pynvml", "torch", "numpy", "scipy"})
    assert not any(name.startswith(("gpuq.daemon", "gpuq.runner")) for name in modules)

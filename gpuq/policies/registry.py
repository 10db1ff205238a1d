"""The one policy registry: `get_policy(name, seed=0)` for the daemon, simulator and benchmarks.

Every policy has one entry: its module, its class, and whether the daemon
can run it yet (`live`). The configuration (`check_live_policy`), `gpuq
doctor`, `gpuq sim`, the benchmarks and the daemon all build policies
(`gpuq.policies.interface`) through this table, so a name always means the
same object wherever it runs.
Each policy module is imported only when its policy is asked for, so
importing the registry stays light (no numpy, no scipy) and a policy whose
module is missing from a build makes only that policy unavailable.

A policy class is built with `seed=seed` when its constructor takes a `seed`
parameter, and with no arguments otherwise. A name may carry constructor
options, `NAME:KEY=VALUE[:KEY=VALUE...]` (`gpuq:starts=free`, `pollux:p=-0.5`),
to compare a policy's variants in `gpuq sim` and the benchmark; values are
read as integers, floats or true/false where they parse as such, else as
text, and only the constructor's own keyword parameters are accepted.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from gpuq.errors import UsageError
from gpuq.policies.interface import Policy


@dataclass(frozen=True, slots=True)
class Entry:
    """Where a policy's class lives, and whether the daemon runs it (`live`)."""

    module: str
    cls: str
    live: bool = False


_POLICIES: dict[str, Entry] = {
    "fifo": Entry("gpuq.policies.fifo", "FifoBackfill", live=True),
    "srtf": Entry("gpuq.policies.baselines", "SrtfPolicy"),
    "srsf": Entry("gpuq.policies.baselines", "SrsfPolicy"),
    "tiresias": Entry("gpuq.policies.tiresias", "TiresiasPolicy", live=True),
    "optimus": Entry("gpuq.policies.optimus", "OptimusPolicy"),
    "afs": Entry("gpuq.policies.afs.policy", "AfsPolicy"),
    "afs-p": Entry("gpuq.policies.afs.policy", "AfsPPolicy"),
    "pollux": Entry("gpuq.policies.pollux.policy", "PolluxPolicy", live=True),
    "sia": Entry("gpuq.policies.sia.policy", "SiaPolicy"),
    "gandiva": Entry("gpuq.policies.gandiva.policy", "GandivaPolicy", live=True),
    "ones": Entry("gpuq.policies.ones.policy", "OnesPolicy"),
    "gpuq": Entry("gpuq.policies.gpuq.policy", "GpuqPolicy", live=True),
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
"""Every name `get_policy` knows, baselines first."""

LIVE_POLICY_NAMES: tuple[str, ...] = tuple(name for name, e in _POLICIES.items() if e.live)
"""The names the daemon runs (`scheduler.policy`); the rest run only in `gpuq sim`."""


def _entry(name: str) -> Entry:
    """The entry of policy `name`; unknown names list the known ones."""
    entry = _POLICIES.get(name)
    if entry is None:
        raise UsageError(
            f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}",
            hint="pick one of the names listed, or several with --compare a,b,c",
        )
    return entry


def policy_location(name: str) -> tuple[str, str]:
    """The module path and class name of policy `name`; unknown names list the known ones."""
    entry = _entry(name)
    return entry.module, entry.cls


def check_live_policy(spec: str) -> str:
    """`spec` if the daemon can run it, else a UsageError listing the policies it can.

    The configuration calls this when it is read, so a policy the daemon
    cannot run, or an option it does not take (`tiresias:thresholds_gpu_hours=1`
    is checked by building it), is refused then, not when the daemon starts;
    so is a variant that reads remaining work (an oracle in the simulator),
    until the daemon estimates it.
    """
    name = split_policy_spec(spec)[0]
    entry = _POLICIES.get(name)
    live = ", ".join(LIVE_POLICY_NAMES)
    hint = "set scheduler.policy to one of those; `gpuq sim --compare` runs every policy"
    if entry is None:
        raise UsageError(f"unknown policy {spec!r}; the daemon runs: {live}", hint=hint)
    if not entry.live:
        raise UsageError(
            f"policy {spec!r} runs only in the simulator so far (gpuq sim); "
            f"the daemon runs: {live}",
            hint=hint,
        )
    if get_policy(spec).capabilities.remaining_work:
        raise UsageError(
            f"policy {spec!r} reads each job's remaining work, which the daemon does not "
            "estimate yet",
            hint="drop the option that needs it (gpuq:remaining_aware=true), or use gpuq sim",
        )
    return spec


def check_lab_policy(spec: str) -> str:
    """`spec` if it applies a lab's fair share and per-user limits, else a UsageError.

    A lab daemon (`[lab] enabled`) serves many users; a policy without
    `capabilities.fair_share` would order and size their jobs without regard
    to their owners and let any of them past `max_gpus` and `max_running`,
    whatever the configuration says. So the configuration refuses it when
    it is read.
    """
    if get_policy(spec).capabilities.fair_share:
        return spec
    fair = [name for name in LIVE_POLICY_NAMES if get_policy(name).capabilities.fair_share]
    raise UsageError(
        f"policy {spec!r} does not apply a lab's fair share or its per-user limits "
        f"([lab] shares, max_gpus, max_running); in lab mode the daemon runs: {', '.join(fair)}",
        hint="set scheduler.policy to one of those (gpuq is the default), or compare the "
        "others on the lab's workload with gpuq sim",
    )


def policy_available(name: str) -> bool:
    """True when policy `name` is known and its module is present in this build."""
    entry = _POLICIES.get(name)
    return entry is not None and importlib.util.find_spec(entry.module) is not None


def available_policies() -> tuple[str, ...]:
    """The known policies whose module is present, in registry order."""
    return tuple(name for name in POLICY_NAMES if policy_available(name))


def split_policy_spec(spec: str) -> tuple[str, dict[str, object]]:
    """`NAME:KEY=VALUE...` as the name and its options (module docstring)."""
    name, *parts = spec.split(":")
    options: dict[str, object] = {}
    for part in parts:
        key, equals, text = part.partition("=")
        if not equals or not key.isidentifier() or key == "seed":
            raise UsageError(
                f"bad policy option {part!r} in {spec!r}",
                hint="write options as NAME:KEY=VALUE, e.g. gpuq:starts=free (the seed has "
                "its own flag)",
            )
        value = _option_value(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(
                f"bad policy option {part!r} in {spec!r}: {key} must be a finite number",
                hint="NaN and infinity are refused; give a number (gpuq:quantum=30), and turn "
                "a feature off with its own switch (gpuq:moves=false)",
            )
        options[key] = value
    return name, options


def _option_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


_KINDS: dict[type, str] = {bool: "true or false", int: "a whole number", float: "a number"}


def _typed_option(name: str, cls: Any, key: str, value: object, default: object) -> object:
    """`value` as its policy's constructor takes it; UsageError for one it does not (`quantum=abc`).

    Read from the constructor's annotations: bool, int, float and str, in a
    union or not, Literal choices, and sets of names (comma-separated); a
    number given to a text option is its text (`starts=5`). An option whose
    annotation names none of these is left to the constructor to judge.
    """
    try:
        hint = typing.get_type_hints(cls.__init__)[key]
    except Exception:  # noqa: BLE001 - no annotations to check against: the constructor judges
        return value
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    choices: list[object] = []
    simple: set[type] = set()
    for arg in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(arg) is typing.Literal:
            choices.extend(typing.get_args(arg))
        elif arg in (bool, int, float, str):
            simple.add(arg)
        elif typing.get_origin(arg) is frozenset and typing.get_args(arg) == (str,):
            return frozenset(_shown(value).split(","))  # names=bert,gpt: a set of names
    if not simple and not choices:
        return value
    if value in choices or (isinstance(value, str) and str in simple):
        return value
    if isinstance(value, bool):
        fits = bool in simple
    elif isinstance(value, int):
        fits = int in simple or float in simple
    else:
        fits = isinstance(value, float) and float in simple
    if fits:
        return value
    if str in simple and not isinstance(value, str):
        return _shown(value)
    wanted = [_KINDS[kind] for kind in (bool, int, float) if kind in simple]
    if float in simple and int in simple:
        wanted.remove("a whole number")
    wanted += [repr(choice) for choice in choices]
    raise UsageError(
        f"policy {name!r}: {key} must be {' or '.join(wanted)}, got {_shown(value)!r}",
        hint=f"its default: {name}:{key}={_shown(default)}"
        if default is not inspect.Parameter.empty and default is not None
        else "docs/configuration.md describes the policies' options",
    )


def _shown(value: object) -> str:
    """An option value as written in a policy spec (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def get_policy(name: str, seed: int = 0) -> Policy:
    """A fresh policy object by name (with options), seeded when it takes a seed."""
    name, options = split_policy_spec(name)
    entry = _entry(name)
    if importlib.util.find_spec(entry.module) is None:
        raise UsageError(
            f"policy {name!r} is not available in this build (no module {entry.module})",
            hint=f"available: {', '.join(available_policies())}",
        )
    cls: Any = getattr(importlib.import_module(entry.module), entry.cls)
    parameters = inspect.signature(cls).parameters
    accepted = sorted(
        key
        for key, parameter in parameters.items()
        if key != "seed" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    )
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UsageError(
            f"policy {name!r} has no option {', '.join(unknown)}",
            hint=f"its options: {', '.join(accepted)}" if accepted else "it takes no options",
        )
    for key, value in options.items():
        options[key] = _typed_option(name, cls, key, value, parameters[key].default)
    if "seed" in parameters:
        options["seed"] = seed
    try:
        policy: Policy = cls(**options)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"policy {name!r}: {exc}", hint="check the option values") from None
    return policy


__all__ = [
    "LIVE_POLICY_NAMES",
    "POLICY_NAMES",
    "available_policies",
    "check_lab_policy",
    "check_live_policy",
    "get_policy",
    "policy_available",
    "policy_location",
    "split_policy_spec",
]

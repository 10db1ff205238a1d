"""The simulator's policy registry: `get_elastic_policy(name, seed=0)`.

The simulator, `gpuq sim` and the benchmarks build policies
(`gpuq.policies.interface`) by name through this table; the daemon runs the
policies of `gpuq.policies.get_policy`, and `check_live_policy` tells the
two apart when a configuration is read.
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
from typing import Any

from gpuq.errors import UsageError
from gpuq.policies.interface import Policy

_POLICIES: dict[str, tuple[str, str]] = {
    "fifo": ("gpuq.policies.baselines", "FifoPolicy"),
    "srtf": ("gpuq.policies.baselines", "SrtfPolicy"),
    "srsf": ("gpuq.policies.baselines", "SrsfPolicy"),
    "tiresias": ("gpuq.policies.tiresias", "TiresiasPolicy"),
    "optimus": ("gpuq.policies.optimus", "OptimusPolicy"),
    "afs": ("gpuq.policies.afs.policy", "AfsPolicy"),
    "afs-p": ("gpuq.policies.afs.policy", "AfsPPolicy"),
    "pollux": ("gpuq.policies.pollux.policy", "PolluxPolicy"),
    "gandiva": ("gpuq.policies.gandiva.policy", "GandivaPolicy"),
    "ones": ("gpuq.policies.ones.policy", "OnesPolicy"),
    "gpuq": ("gpuq.policies.gpuq.policy", "GpuqPolicy"),
}

ELASTIC_POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
"""Every name `get_elastic_policy` knows, baselines first."""


def _known() -> str:
    return ", ".join(ELASTIC_POLICY_NAMES)


def policy_location(name: str) -> tuple[str, str]:
    """The module path and class name of policy `name`; unknown names list the known ones."""
    location = _POLICIES.get(name)
    if location is None:
        raise UsageError(
            f"unknown policy {name!r}; known: {_known()}",
            hint="pick one of the names listed, or several with --compare a,b,c",
        )
    return location


def check_live_policy(name: str) -> str:
    """`name` if the daemon can run it, else a UsageError listing the ones it can.

    The configuration calls this when it is read, so a policy the daemon
    cannot run is refused then, not when the daemon starts.
    """
    from gpuq.policies import POLICY_NAMES

    if name in POLICY_NAMES:
        return name
    live = ", ".join(POLICY_NAMES)
    if split_policy_spec(name)[0] in _POLICIES:
        raise UsageError(
            f"policy {name!r} runs only in the simulator so far (gpuq sim); the daemon runs: {live}"
        )
    raise UsageError(f"unknown policy {name!r}; the daemon runs: {live}")


def elastic_policy_available(name: str) -> bool:
    """True when policy `name` is known and its module is present in this build."""
    location = _POLICIES.get(name)
    return location is not None and importlib.util.find_spec(location[0]) is not None


def available_elastic_policies() -> tuple[str, ...]:
    """The known policies whose module is present, in registry order."""
    return tuple(name for name in ELASTIC_POLICY_NAMES if elastic_policy_available(name))


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
        options[key] = _option_value(text)
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


def get_elastic_policy(name: str, seed: int = 0) -> Policy:
    """A fresh elastic policy object by name (with options), seeded when it takes a seed."""
    name, options = split_policy_spec(name)
    module_name, class_name = policy_location(name)
    if importlib.util.find_spec(module_name) is None:
        raise UsageError(
            f"policy {name!r} is not available in this build (no module {module_name})",
            hint=f"available: {', '.join(available_elastic_policies())}",
        )
    cls: Any = getattr(importlib.import_module(module_name), class_name)
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
    if "seed" in parameters:
        options["seed"] = seed
    try:
        policy: Policy = cls(**options)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"policy {name!r}: {exc}", hint="check the option values") from None
    return policy


__all__ = [
    "ELASTIC_POLICY_NAMES",
    "check_live_policy",
    "available_elastic_policies",
    "elastic_policy_available",
    "get_elastic_policy",
    "policy_location",
    "split_policy_spec",
]

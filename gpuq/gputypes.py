"""GPU types: the model a GPU's name reports, without vendor and form-factor words.

Schedulers that know GPU generations (Sia's goodput per type) and users
who ask for one (`--gpu-type A100`) name a GPU by its type, not by the
full name NVML reports: "NVIDIA A100-SXM4-40GB" and "NVIDIA A100 80GB PCIe"
are both ``A100``. Fake GPUs are typed by their declared name ("Fake L4":
``L4``). Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

_VENDOR_WORDS: Final = frozenset({"nvidia", "tesla", "geforce", "quadro", "fake"})
"""Words before the model that say nothing of it."""
_SERIES: Final = frozenset({"rtx", "gtx", "titan"})
"""Series words that only name a model together with the number after them."""
_SUFFIXES: Final = frozenset({"ti", "super", "ada"})
"""Words after a series model that change the model (RTX 2080 Ti is not an RTX 2080)."""


def gpu_type(name: str) -> str:
    """The type of a GPU named `name`, such as ``A100``, ``T4``, ``RTX2080Ti`` or ``A6000``.

    The first word past the vendor's names, cut at its first hyphen
    ("A100-SXM4-40GB": ``A100``); a series word joins the number after it
    and a Ti, SUPER or Ada suffix ("GeForce RTX 2080 Ti": ``RTX2080Ti``),
    except before a model of its own ("RTX A6000": ``A6000``). A MIG
    instance has its parent's type. A name with nothing else is its own type.
    """
    words = name.replace("_", " ").split()
    if "MIG" in words:
        words = words[: words.index("MIG")]
    while words and words[0].lower() in _VENDOR_WORDS:
        words = words[1:]
    if not words:
        return name.strip() or "unknown"
    first, rest = words[0], words[1:]
    if first.lower() in _SERIES and rest:
        if rest[0][:1].isalpha():
            return rest[0].split("-")[0]
        model = first.upper() + rest[0].split("-")[0]
        for word in rest[1:2]:
            if word.lower() in _SUFFIXES:
                model += word.capitalize()
        return model
    return first.split("-")[0]


def matches(name: str, types: tuple[str, ...]) -> bool:
    """True if a GPU named `name` is of one of `types` (case-insensitive)."""
    wanted = {t.lower() for t in types}
    return gpu_type(name).lower() in wanted


RELATIVE_SPEED: Final = {"T4": 1.0, "RTX2080Ti": 1.41, "RTX6000": 1.93, "A100": 4.14}
"""A type's training throughput on one GPU against a T4's: the prior for a type a job
has not run on yet (`relative_speed`).

The geometric mean over the six applications of Sia's measured tables
(gpuq/sim/data/sia: samples per second on one GPU at the largest per-GPU
batch measured, `Application.single_gpu_throughput`), so one model's
quirks (yolov3 runs slower on an RTX 2080 Ti than on a T4) do not decide it.
"""


def relative_speed(kind: str) -> float | None:
    """The prior throughput of GPU type `kind` against a T4 (None: a type without data)."""
    for known, speed in RELATIVE_SPEED.items():
        if known.lower() == kind.lower():
            return speed
    return None


__all__ = ["RELATIVE_SPEED", "gpu_type", "matches", "relative_speed"]

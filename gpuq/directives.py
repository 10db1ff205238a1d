"""`#GPUQ` directives: `gpuq submit` options written at the top of a job script.

Like Slurm's `#SBATCH`, directive lines come first in the script, after an
optional shebang and among other comment or blank lines; the first line that
is neither ends the search, so a `#GPUQ` further down is ignored::

    #!/bin/bash
    # train the small model
    #GPUQ --gpus 2 --name train
    #GPUQ --time 4h   # a trailing comment is allowed
    python train.py

Each directive is split like a shell command line (quotes and backslashes
work, a `#` starting a word begins a comment). Options on the command line
are meant to win over directives; that merging is the caller's job.
"""

from __future__ import annotations

import shlex

from gpuq.errors import UsageError

DIRECTIVE_PREFIX = "#GPUQ"
"""What starts a directive line (case-sensitive; `##GPUQ` or `# GPUQ` disables one)."""


def parse_directives(text: str) -> list[str]:
    """The option tokens of the `#GPUQ` lines at the top of a script, in order.

    Raises `UsageError` naming the line number when a directive's quoting is
    unbalanced.
    """
    return [token for _, tokens in directive_lines(text) for token in tokens]


def directive_lines(text: str) -> list[tuple[int, list[str]]]:
    """The `#GPUQ` lines at the top of a script as (line number, option tokens).

    The line numbers let a caller say which directive an invalid option came
    from. Raises `UsageError` as `parse_directives` does.
    """
    lines: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        rest = stripped.removeprefix(DIRECTIVE_PREFIX)
        if rest == stripped or (rest and not rest[0].isspace()):
            continue  # an ordinary comment, or a word such as "#GPUQS"
        try:
            lines.append((number, shlex.split(_strip_comment(rest))))
        except ValueError as exc:
            raise UsageError(
                f"line {number}: cannot split #GPUQ directive {stripped!r}: {exc}",
                "close the quote, or escape a literal quote with a backslash",
            ) from None
    return lines


def _strip_comment(text: str) -> str:
    """`text` up to an unquoted `#` that starts a word, as a shell would read it."""
    quote = ""
    escaped = False
    at_word_start = True
    for index, char in enumerate(text):
        if escaped:
            escaped = at_word_start = False
        elif quote:
            escaped = char == "\\" and quote == '"'
            quote = "" if char == quote else quote
        elif char == "#" and at_word_start:
            return text[:index]
        else:
            escaped = char == "\\"
            quote = char if char in "'\"" else ""
            at_word_start = char.isspace()
    return text

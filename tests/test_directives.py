"""`#GPUQ` directive lines at the top of a job script."""

from __future__ import annotations

import pytest

from gpuq.directives import parse_directives
from gpuq.errors import UsageError


@pytest.mark.parametrize(
    ("script", "tokens"),
    [
        ("#GPUQ --gpus 2 --name train\n", ["--gpus", "2", "--name", "train"]),
        ("#!/bin/bash\n#GPUQ --gpus 2\n", ["--gpus", "2"]),
        ("#!/bin/bash\n#GPUQ --gpus 2\n#GPUQ --time 4h\n", ["--gpus", "2", "--time", "4h"]),
        # Comments and blank lines may come between directives.
        (
            "#!/bin/sh\n\n# set up\n#GPUQ -n a\n\n# more\n#GPUQ --retries 1\n",
            ["-n", "a", "--retries", "1"],
        ),
        # The first line that is not a comment ends the directives, as in Slurm.
        ("#GPUQ --gpus 1\necho hi\n#GPUQ --gpus 8\n", ["--gpus", "1"]),
        ("python train.py\n#GPUQ --gpus 8\n", []),
        ('"""docstring"""\n#GPUQ --gpus 8\n', []),
        # Shell quoting.
        ("#GPUQ --name 'my job'\n", ["--name", "my job"]),
        ('#GPUQ --name "a \\"b\\""\n', ["--name", 'a "b"']),
        ("#GPUQ --name a\\ b\n", ["--name", "a b"]),
        # A # starting a word begins a comment; inside a word or quotes it does not.
        ("#GPUQ --gpus 2  # two GPUs\n", ["--gpus", "2"]),
        ("#GPUQ --name run#3\n", ["--name", "run#3"]),
        ("#GPUQ --name '# not a comment'\n", ["--name", "# not a comment"]),
        ("#GPUQ --name a\\ #b\n", ["--name", "a #b"]),
        # Not directives.
        ("##GPUQ --gpus 8\n#GPUQ --gpus 1\n", ["--gpus", "1"]),
        ("# GPUQ --gpus 8\n", []),
        ("#GPUQS --gpus 8\n#gpuq --gpus 8\n", []),
        ("#SBATCH --gpus 8\n", []),
        ("#!/bin/bash --login\n", []),
        ("", []),
        # Spacing, indentation and line endings.
        ("#GPUQ\t--gpus\t2\n", ["--gpus", "2"]),
        ("  #GPUQ --gpus 2\n", ["--gpus", "2"]),
        ("#GPUQ\n#GPUQ --gpus 2", ["--gpus", "2"]),
        ("#!/bin/bash\r\n#GPUQ --gpus 2\r\n", ["--gpus", "2"]),
        ("\ufeff#GPUQ --gpus 2\n", ["--gpus", "2"]),
        ("#GPUQ --gpus=2 --output=logs/%x-%j.out\n", ["--gpus=2", "--output=logs/%x-%j.out"]),
    ],
)
def test_parse_directives(script: str, tokens: list[str]) -> None:
    assert parse_directives(script) == tokens


def test_a_shebang_only_counts_on_the_first_line() -> None:
    assert parse_directives("# hi\n#!/bin/bash\n#GPUQ --gpus 2\n") == ["--gpus", "2"]


@pytest.mark.parametrize(
    ("script", "line"),
    [
        ("#GPUQ --name 'unclosed\n", 1),
        ('#!/bin/bash\n# ok\n#GPUQ --gpus 1\n#GPUQ --name "half\n', 4),
        ("#GPUQ --name trailing\\\n", 1),
    ],
)
def test_bad_quoting_names_the_line(script: str, line: int) -> None:
    with pytest.raises(UsageError) as info:
        parse_directives(script)
    assert info.value.message.startswith(f"line {line}: ")
    assert "#GPUQ" in info.value.message
    assert info.value.hint is not None and "quote" in info.value.hint

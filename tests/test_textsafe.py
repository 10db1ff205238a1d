r"""`gpuq.textsafe.visible`: what reaches a terminal from user text.

Control characters, C1 codes, bidi controls, line separators and lone
surrogates become the escapes `repr` writes (`\x1b`, `\n`, `\u202e`);
every other character, backslashes included, passes unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata

import pytest

from gpuq.textsafe import UNSAFE_CHARACTERS, visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("clear\x1b[2Jscreen", "clear\\x1b[2Jscreen"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("ring\x07", "ring\\x07"),
        ("two\nlines", "two\\nlines"),
        ("tab\there", "tab\\there"),
        ("carriage\rreturn", "carriage\\rreturn"),
        ("nul\x00byte", "nul\\x00byte"),
        ("unit\x1fsep", "unit\\x1fsep"),
        ("del\x7f", "del\\x7f"),
        ("c1 csi\x9b2J", "c1 csi\\x9b2J"),
        ("next line\x85", "next line\\x85"),
        ("access\u202eevil", "access\\u202eevil"),
        ("isolate\u2066x\u2069", "isolate\\u2066x\\u2069"),
        ("mark\u200f", "mark\\u200f"),
        ("arabic mark\u061c", "arabic mark\\u061c"),
        ("line\u2028sep", "line\\u2028sep"),
        ("paragraph\u2029sep", "paragraph\\u2029sep"),
        ("not utf-8 \udcff", "not utf-8 \\udcff"),
    ],
)
def test_unsafe_characters_are_written_as_repr_escapes(text: str, shown: str) -> None:
    assert visible(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "",
        "train-bert",
        "python train.py --lr 3e-4 --data /data/imagenet",
        "ünïcødé naïve café",
        "训练任务",
        "ジョブ",
        "👩‍🔬 lab run 🚀",  # the zero-width joiner of an emoji sequence stays
        "नमस्ते",  # so do the joiners and marks of other scripts
        "[bold]not markup[/bold]",
        "C:\\data\\run",
        "sed 's/a\\.b/c/'",
        "printf 'a\\n'",  # a backslash and an n, not a newline: unchanged
    ],
)
def test_ordinary_text_is_unchanged(text: str) -> None:
    assert visible(text) == text


def test_a_backslash_is_left_as_it_is_so_an_escape_lookalike_is_not_doubled() -> None:
    # The price of leaving backslashes alone: these two read the same.
    # Programs that need to tell them apart read --json.
    assert visible("\\x1b") == visible("\x1b") == "\\x1b"


@pytest.mark.parametrize(
    ("text", "keep", "shown"),
    [
        ("a\nb\tc\rd", "\n\r\t", "a\nb\tc\rd"),
        ("out\x1b[2J\n", "\n\r\t", "out\\x1b[2J\n"),
        ("a\nb\tc", "\n", "a\nb\\tc"),
    ],
)
def test_keep_lets_layout_characters_through(text: str, keep: str, shown: str) -> None:
    assert visible(text, keep=keep) == shown


def test_every_c0_c1_and_del_character_is_escaped() -> None:
    for code in [*range(0x20), *range(0x7F, 0xA0)]:
        shown = visible(chr(code))
        assert shown.startswith("\\"), hex(code)
        assert all(0x20 <= ord(char) < 0x7F for char in shown), hex(code)


def test_the_escapes_match_python_repr() -> None:
    for char in sorted(UNSAFE_CHARACTERS):
        assert visible(char) == repr(char)[1:-1], hex(ord(char))


def test_every_bidi_control_and_mark_is_escaped() -> None:
    explicit = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}
    controls = [chr(c) for c in range(0x10000) if unicodedata.bidirectional(chr(c)) in explicit]
    marks = [unicodedata.lookup(f"{side} MARK") for side in ("LEFT-TO-RIGHT", "RIGHT-TO-LEFT")]
    marks.append(unicodedata.lookup("ARABIC LETTER MARK"))
    assert len(controls) == 9  # embeddings, overrides, pop, isolates
    assert all(char in UNSAFE_CHARACTERS for char in controls + marks)


def test_every_control_separator_and_surrogate_code_point_is_escaped() -> None:
    categories = {"Cc", "Zl", "Zp", "Cs"}
    chars = [chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) in categories]
    assert all(char in UNSAFE_CHARACTERS for char in chars)


def test_the_output_has_no_unsafe_character_left() -> None:
    hostile = "".join(sorted(UNSAFE_CHARACTERS)) + "tail"
    assert not UNSAFE_CHARACTERS & set(visible(hostile))


def test_importing_it_stays_light() -> None:
    code = (
        "import sys, gpuq.textsafe; "
        "print(sorted(m for m in ('typer', 'textual', 'rich', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"

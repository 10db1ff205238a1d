r"""Make untrusted text safe to show on a terminal.

Job names, commands, paths and reasons are user text, and a terminal obeys
some of the characters they may hold: ESC starts a sequence that can clear
the screen or set the window title, BEL rings, a newline forges a table row,
C1 code points such as U+009B act as CSI on some terminals, and Unicode
bidi controls reorder what is shown ("Trojan Source"). `visible` writes each
such character as the escape Python's `repr` uses (`\x1b`, `\n`, `\u202e`)
and leaves everything else, non-ASCII letters, CJK and emoji included, as it is.

Escaped: C0 controls (U+0000-U+001F, tab and newline too, since both break
a table's columns), DEL (U+007F), C1 controls (U+0080-U+009F), the bidi
embeddings, overrides, isolates and marks (U+061C, U+200E, U+200F,
U+202A-U+202E, U+2066-U+2069), the line and paragraph separators U+2028 and
U+2029, and lone surrogates (U+D800-U+DFFF, which a non-UTF-8 argument
becomes and which cannot be printed). Zero-width joiners and other format
characters stay: emoji sequences and several scripts need them.

A backslash is left as it is, so `C:\data` and `sed 's/a\.b/c/'` read as
typed. The output is therefore for people, not a reversible encoding: a name
that really contains the four characters `\x1b` shows the same as one
holding ESC. Programs read `--json`, which keeps every string exact.

Stdlib only: the CLI and the TUI both import it.
"""

from __future__ import annotations

import functools
import re
from typing import Final

_SHORT_ESCAPES: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNSAFE_RANGES: Final = (
    (0x00, 0x1F),  # C0 controls
    (0x7F, 0x9F),  # DEL and the C1 controls
    (0x061C, 0x061C),  # ARABIC LETTER MARK
    (0x200E, 0x200F),  # LEFT-TO-RIGHT and RIGHT-TO-LEFT MARK
    (0x2028, 0x2029),  # LINE and PARAGRAPH SEPARATOR
    (0x202A, 0x202E),  # bidi embeddings and overrides
    (0x2066, 0x2069),  # bidi isolates
    (0xD800, 0xDFFF),  # surrogates
)
UNSAFE_CHARACTERS: Final = frozenset(
    chr(code) for low, high in _UNSAFE_RANGES for code in range(low, high + 1)
)
"""Every character `visible` escapes."""

_UNSAFE: Final = re.compile(
    "[" + "".join(f"\\u{low:04x}-\\u{high:04x}" for low, high in _UNSAFE_RANGES) + "]"
)


def _escape(char: str) -> str:
    r"""`\n` for the three common ones, else `\xNN` or `\uNNNN` as `repr` writes it."""
    code = ord(char)
    return _SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


@functools.cache
def _table(keep: str) -> dict[int, str]:
    """The `str.translate` table for the unsafe characters not in `keep`."""
    return {ord(char): _escape(char) for char in UNSAFE_CHARACTERS if char not in keep}


def visible(text: str, keep: str = "") -> str:
    r"""`text` with every unsafe character (module docstring) written as an escape.

    Characters in `keep` pass unchanged: a log view keeps `"\n\r\t"`,
    which it lays out itself. Text without unsafe characters is returned
    as is, so ordinary output costs one regular-expression scan.
    """
    if _UNSAFE.search(text) is None:
        return text
    return text.translate(_table(keep))

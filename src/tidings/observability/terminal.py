"""Making text from jobs and remote peers safe to print on an operator's terminal.

Exception texts, job names, webhook replies and failed-store records come from job
data or from servers tidings talks to. Printed raw, a control sequence in them can
rewrite the screen (``ESC[2K``), set the clipboard (OSC 52), change the window title or,
through the 8-bit C1 ``CSI`` (``\\x9b``), do the same without an ESC byte; bidi overrides
(``U+202E``) make a line read differently from what it holds. :func:`escape` turns every
such character into a visible escape (``\\x1b``, ``\\u202e``), so the text stays readable
and nothing reaches the terminal as a command.

Every CLI output path and the worker's log lines use it for such data.
"""

from __future__ import annotations

import logging
import re

from tidings.observability.redaction import redact

__all__ = ["EscapingFormatter", "escape", "escape_json"]

# C0 controls, DEL and C1 controls; bidi embeddings, overrides and isolates; the line
# and paragraph separators some terminals honour.
_CODEPOINTS = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x2028,
    0x2029,
]


def _escape_of(cp: int) -> str:
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}"


_TABLE = {cp: _escape_of(cp) for cp in _CODEPOINTS}
_MULTILINE_TABLE = {cp: v for cp, v in _TABLE.items() if cp not in (0x09, 0x0A)}
# One scan for "anything to escape at all": most lines have nothing, and str.translate
# with a table looks up every character (about 8x the scan on a typical log line).
_ANY = re.compile("[" + "".join(re.escape(chr(cp)) for cp in _TABLE) + "]")
_ANY_MULTILINE = re.compile("[" + "".join(re.escape(chr(cp)) for cp in _MULTILINE_TABLE) + "]")


def escape(text: object, *, multiline: bool = False) -> str:
    """Escape every control and bidi character in ``text`` for printing.

    Args:
        text: anything; it is turned into ``str`` first.
        multiline: keep line feeds and tabs (tracebacks, ``failed show``); without it a
            newline is escaped too, so one record stays one line.

    Returns:
        The text with each such character replaced by ``\\xNN`` or ``\\uNNNN``; lone
        surrogates (from undecodable bytes) become ``\\udcNN``.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isascii():
        if (_ANY_MULTILINE if multiline else _ANY).search(s) is None:
            return s
        return s.translate(_MULTILINE_TABLE if multiline else _TABLE)
    s = s.translate(_MULTILINE_TABLE if multiline else _TABLE)
    return "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)


class EscapingFormatter(logging.Formatter):
    """A log formatter that redacts secrets and escapes control characters.

    Log records carry exception texts and tracebacks from job code and remote replies;
    the whole formatted line (traceback included) is redacted, then escaped, keeping
    the traceback's own line breaks.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Format as usual, then redact and escape."""
        return escape(redact(super().format(record)), multiline=True)


# JSON output: the same characters as JSON ``\uXXXX`` escapes, so the text is safe on a
# terminal and parses back to exactly the same data. (orjson already escapes C0.)
_JSON_TABLE = {cp: f"\\u{cp:04x}" for cp in _CODEPOINTS if cp >= 0x7F}


def escape_json(encoded: str) -> str:
    """Make encoded JSON text terminal-safe without changing the data it decodes to."""
    return encoded.translate(_JSON_TABLE)

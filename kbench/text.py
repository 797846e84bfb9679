"""Text from outside kbench made safe to store and print: the one escape both boundaries use.

Strings a worker sends (reasons, messages, anything in a reply: :func:`kbench.protocol.decode_reply`), strings
read from a file (:func:`kbench.reader.parse_json`) and a kernel file's ``NAME`` (:mod:`kbench.kernelfile`) pass
through :func:`safe_text`, so a record and the screen only ever hold text that encodes as UTF-8 and shows what
it says. Escaped as Python writes them (``\\ud800``, ``\\x1b``, ``\\u202e``):

* lone surrogates (U+D800-U+DFFF): they cannot be encoded, so printing or writing them as UTF-8 raises;
* control characters (C0 but tab and newline, DEL, C1): a terminal obeys them (``\\r`` overwrites a line,
  ``ESC [`` recolours or clears the screen);
* format characters (Unicode category Cf: bidi embeddings, overrides and isolates, zero-width characters,
  the byte-order mark...) and the line and paragraph separators: they reorder or hide what is shown, so
  ``numpy\\u202e`` or ``num\\u200bpy`` would read as another name.

Backslashes are kept as they are, so escaping twice changes nothing (``safe_text(safe_text(s)) == safe_text(s)``).
This module imports only :mod:`re`: it is on the worker's import path.
"""
from __future__ import annotations

import re
from typing import Any

# Unicode categories Cc, Cf, Cs, Zl and Zp (tab and newline excepted), as of Unicode 15 (Python 3.12); a test
# holds the class to ``unicodedata`` of the running Python (tests/test_text.py)
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(text: str) -> str:
    """``text`` with every lone surrogate, control, format (bidi, zero-width) and line-separator character
    written as its escape; the same object when there is none (the common case costs one search)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def is_safe(text: str) -> bool:
    """Whether :func:`safe_text` would leave ``text`` as it is."""
    return _UNSAFE.search(text) is None


def safe_strings(value: Any) -> Any:
    """Parsed JSON with :func:`safe_text` applied to every string, keys included.

    Lists and dicts are changed in place (a dict is rebuilt only when one of its keys changes); returns the
    value to use (a new string for a string). Arrays holding only numbers (samples) are passed over in bulk.
    The caller has bounded the nesting depth (the walk recurses)."""
    kind = type(value)
    if kind is str:
        return safe_text(value)
    if kind is list:
        kinds = set(map(type, value))
        if str in kinds or list in kinds or dict in kinds:
            for i, item in enumerate(value):
                if type(item) in (str, list, dict):
                    value[i] = safe_strings(item)
        return value
    if kind is dict:
        if any(type(k) is str and _UNSAFE.search(k) for k in value):
            return {safe_text(k) if type(k) is str else k: safe_strings(v) for k, v in value.items()}
        for key, item in value.items():
            if type(item) in (str, list, dict):
                value[key] = safe_strings(item)
        return value
    return value


def may_need_escapes(text: str) -> bool:
    """Whether JSON text could hold a string :func:`safe_text` changes: an unsafe character as it is, or a
    ``\\u``, ``\\b``, ``\\f`` or ``\\r`` escape that decodes to one (a quick test before a walk of the data)."""
    return "\\u" in text or "\\b" in text or "\\f" in text or "\\r" in text or _UNSAFE.search(text) is not None

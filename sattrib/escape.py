"""Text that users wrote, made safe to print: a job's name, user, paths, log lines and summaries
reach terminals and spreadsheets, and neither may take instructions from them.

`visible` turns every control character (C0, DEL, C1 and the bidirectional overrides) into a
`\\x1b`-style escape, so an OSC 52 clipboard write or a clear-screen in a job name is shown,
never obeyed; every text printer of the CLI passes its fields through it. `spreadsheet_cell`
defuses a cell that a spreadsheet would read as a formula (`=`, `+`, `-`, `@`, tab, carriage
return first), for `sattrib list -P` and the dashboard's CSV.
"""
from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")   # json.dumps escapes C0
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str) -> str:
    """The text with each control character written as an escape (`\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def visible_all(value):
    """Every string in a JSON-shaped value (dicts, lists) made visible."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {k: visible_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [visible_all(v) for v in value]
    return value


def visible_json(text: str) -> str:
    """JSON text with the control characters json.dumps leaves raw (DEL, C1, bidirectional
    overrides) written as \\u escapes: the same JSON value."""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def spreadsheet_cell(text: str) -> str:
    """A cell a spreadsheet would run as a formula, with a `'` before it; numbers such as -5
    stay as they are."""
    if text.startswith(_FORMULA) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text

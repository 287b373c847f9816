"""What anyone may read of a cause: its summary is built from fields (the kind of fault, where,
codes and numbers), never from the text a user's program printed.

A rule lists the captures its `explain` template shows in `public`, each with its kind; every
other capture (a message, a value, a path) is the user's text and stays in the evidence line,
which only those allowed to read evidence see. `check` refuses, when the rule loads, a template
that names any other capture. A shown value must look like its kind, or it is withheld: a
`name` holds no space, quote or `=`, so `KeyError: 'api_token=sk-live-SECRET123'` shows as
`a rank raised KeyError`.

Kinds:
  number      digits, a sign, dotted parts (an Xid, an errno, a count, a driver version)
  name        a host, interface, device, job or step id, serial: letters, digits, `. _ - + *`
  identifier  a Python or C name, dotted (an exception type, a CUDA error name, a series)
  pci         a PCI address
  address     an IP address, with NCCL's `<port>`
  time        an ISO-8601 time stamp
  words       the capture's own pattern admits only the words written in it, digits and spaces
              (`TIME LIMIT|PREEMPTION`): checked when the rule loads, never at run time
  catalog     the words of the message-catalog row that recognised the message, when the row's
              pattern admits only its own words, digits and spaces (`^out of memory`): the
              capture itself where it lies within what the row matched, else what the row
              matched; withheld when no such row recognised the message
"""
from __future__ import annotations

import re
import string
from typing import Optional

from .matcher import PatternError, closed, group_names

_FULL = {
    "number": r"-?[0-9]+(?:\.[0-9]+)*",
    "name": r"[A-Za-z0-9][A-Za-z0-9._+*-]{0,63}",
    "identifier": r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*",
    "pci": r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?",
    "address": r"[0-9A-Fa-f.:\[\]]{2,64}(?:<[0-9]{1,5}>)?",
    "time": r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T _][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?"
            r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?",
}
KINDS = tuple(_FULL) + ("words", "catalog")
MAX_VALUE = 128
# Fields every template may use: the engine places them (node, rank, GPU, a peer it blames)
# or writes them from its catalogs (detail); node, GPU and peer are checked like captures.
BUILTIN = ("node", "rank", "gpu", "peer", "detail")
_RX = {k: re.compile(v) for k, v in _FULL.items()}
WITHHELD = "?"


def fits(kind: str, value) -> bool:
    """Does a value look like its kind? (`words` always does: its pattern made sure.)"""
    if kind == "words":
        return True
    text = str(value)
    return len(text) <= MAX_VALUE and bool(_RX[kind].fullmatch(text))


def shown(kind: str, value) -> str:
    """The value as anyone may see it, or WITHHELD."""
    if value is None or value == "":
        return WITHHELD
    return str(value) if fits(kind, value) else WITHHELD


def fields(template: str) -> list[str]:
    """The field names a template uses; ValueError when it is not a format string."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def check(rule) -> Optional[str]:
    """What is wrong with a rule's `public` captures and `explain` template, or None."""
    groups = group_names(rule.pattern)
    for name, kind in rule.public.items():
        if name in BUILTIN:
            return f"public: {name!r} is placed by the engine; it needs no kind"
        if name not in groups and rule.decode is None:
            return f"public: the pattern has no capture {name!r}"
        if kind == "words":
            try:
                ok = name in groups and closed(rule.pattern, name)
            except PatternError as e:
                return f"public: {name}: {e}"
            if not ok:
                return (f"public: capture {name!r} is not 'words': its pattern can match text "
                        "other than its own words, digits and spaces; give it another kind "
                        "(number, name, identifier, ...) or leave it out of the summary")
    try:
        used = fields(rule.explain)
    except ValueError as e:
        return f"explain: not a template: {e}"
    private = sorted({f for f in used if f not in BUILTIN and f not in rule.public})
    if private:
        return (f"explain: {', '.join(private)} {'is' if len(private) == 1 else 'are'} the "
                "user's text (not in public:): summaries are shown to everyone; name the kind "
                "of fault instead, the evidence line keeps the text")
    key = rule.same_across_nodes
    if key and key not in rule.public:
        return f"same_across_nodes: {key!r} is compared in public text; list it in public:"
    return None


class _Fmt(string.Formatter):
    def get_value(self, key, args, kwargs):
        v = kwargs.get(key)
        return WITHHELD if v is None or v == "" else v

    def format_field(self, value, spec):
        try:
            return super().format_field(value, spec)
        except (ValueError, TypeError):
            return str(value)


_FMT = _Fmt()
# What a withheld or unknown field leaves behind, tidied away: "rank ? on" is "a rank",
# " on ?", " (?)", ": ?" at the end of a clause say nothing.
_TIDY = (
    (re.compile(r"\brank \?(?= on | raised| \(|:|$)"), "a rank"),
    (re.compile(r" on \?(?=[\s:,;)]|$)"), ""),
    (re.compile(r"\s*\(\?\)"), ""),
    (re.compile(r":\s*\?(?=\s*(?:[(,;]|$))"), ""),
    (re.compile(r"\s+\?$"), ""),
)


def summary(ev, phrase: Optional[str] = None) -> str:
    """The rule's `explain` over the event's public captures: `phrase` is what a closed
    catalog row recognised in its message (recognised() below)."""
    rule = ev.rule
    vals = {k: _catalog(ev.caps.get(k), phrase) if kind == "catalog"
            else shown(kind, ev.caps.get(k)) for k, kind in rule.public.items()}
    vals.update(node=shown("name", ev.node), rank=ev.rank, gpu=shown("pci", ev.gpu),
                peer=ev.peer if ev.peer and (fits("address", ev.peer) or fits("name", ev.peer))
                else WITHHELD, detail=ev.detail)
    try:
        text = _FMT.format(rule.explain, **vals)
    except (ValueError, IndexError, KeyError, AttributeError):
        text = rule.title
    for rx, sub in _TIDY:
        text = rx.sub(sub, text)
    return " ".join(text.split())[:300]


def _catalog(value: Optional[str], phrase: Optional[str]) -> str:
    if not phrase:
        return WITHHELD
    return value if value and value in phrase else phrase


def recognised(ev, rows) -> Optional[str]:
    """The words of the catalog row that classified the event as its message shows them
    (`No space left on device`), when that row's pattern admits only its own words, digits
    and spaces; None otherwise. One search, for a cause's summary only."""
    row = next((r for r in rows if r.where == ev.catalog_row), None) if ev.catalog_row else None
    if row is None or not row.closed:
        return None
    m = row.recognise(ev.caps.get(ev.rule.catalog_key) or ev.line.message)
    text = " ".join(m.split()).strip(" :;,") if m else ""
    return text or None

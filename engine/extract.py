"""extract: lines -> events. Runs the rules a line's literals point at, keeps the hits whose
source the rule trusts, applies the message catalog and the rule's decoder."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Optional

from . import decode
from .decode import Event, normalize_pci
from .lineparse import TimeContext, nccl_host, parse_stamp_text
from .models import Line
from .rules import RuleSet
from .taxonomy import Source, Tag


def extract(lines: Iterable[Line], rules: RuleSet, tc: TimeContext,
            notes: Counter) -> list[Event]:
    by_source = rules_by_source(rules)
    events: list[Event] = []
    for ln in lines:
        cands = line_rules(ln, rules, by_source)
        found = ln.found
        hits, kernel_looking = select(ln, cands, lambda c: captures(
            c, ln.message, found, ln.source is Source.kernel))
        if kernel_looking:
            # Looks like (say) a kernel line but came from rank output: not evidence.
            notes[f"{ln.doc}: kernel-looking lines in {ln.source.value} output "
                  "ignored (kernel evidence comes only from kernel logs)"] += kernel_looking
        for c, caps in hits:
            row = found[c.rule.id][1] if found is not None else _UNSET
            events.append(_event(ln, c, dict(caps), tc, row))
        # Used: the reader's search results are most of a kept line's memory, and the
        # events hold their own copies. (A second extract searches again, same answer.)
        ln.found = None
    events.sort(key=Event.sort_key)
    return events


def select(ln: Line, cands, caps_of) -> tuple[list, int]:
    """The hits kept on a line: [(rule, captures)] of the rules that match and trust the line's
    source (`caps_of(rule)`: its captures or None), without fallback rules when another rule
    matched and without catch-all rules when a specific one did; and how many kernel-only rules
    matched a line that is not from a kernel log."""
    hits, kernel_looking = [], 0
    for c in cands:
        if ln.source not in c.rule.source:
            if c.rule.source == [Source.kernel] and caps_of(c) is not None:
                kernel_looking += 1
            continue
        caps = caps_of(c)
        if caps is not None:
            hits.append((c, caps))
    if any(not c.rule.fallback for c, _ in hits):
        hits = [(c, caps) for c, caps in hits if not c.rule.fallback]
    elif any(not c.rule.catch_all for c, _ in hits):
        hits = [(c, caps) for c, caps in hits if not c.rule.catch_all]
    return hits, kernel_looking


def rules_by_source(rules: RuleSet) -> dict[Source, list]:
    by_source: dict[Source, list] = defaultdict(list)
    for c in rules.rules:
        for s in c.rule.source:
            by_source[s].append(c)
    return by_source


def line_rules(ln: Line, rules: RuleSet, by_source: dict) -> list:
    """The rules to run on a line: those its literals point at, or (no prefilter ran on it)
    every rule that reads its source."""
    if ln.candidates is None:
        return by_source.get(ln.source, [])
    return [rules.by_id[r] for r in ln.candidates if r in rules.by_id]


def captures(compiled, message: str, found: Optional[dict] = None,
             kernel: bool = False) -> Optional[dict]:
    """The groups a rule captures on a message (those that took part), or None when it does not
    match. `found`: what the reader's search of this line's candidates already gave; `kernel`:
    the message is a kernel record, read from its start (engine/kmsg.py)."""
    if found is not None:
        hit = found.get(compiled.rule.id)
        return None if hit is None else hit[0]
    m = compiled.search(message, kernel)
    return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


def found_for(ln: Line, cands, caps: dict) -> dict:
    """Line.found from the captures of the candidate rules that matched the line (rule id ->
    captures): the catalog row is looked up only for the hits `select` keeps."""
    kept = {c.rule.id: c for c, _ in select(ln, cands, lambda c: caps.get(c.rule.id))[0]}
    return {r: (cp, catalog_row(kept[r], cp, ln.message) if r in kept and kept[r].rows
                else None) for r, cp in caps.items()}


def catalog_row(compiled, caps: dict, message: str) -> Optional[int]:
    """The first of the rule's message-catalog rows that matches its catalog capture (the whole
    message without one), as an index into compiled.rows; None when no row matches."""
    key = compiled.rule.catalog_key
    if key in ("nccl_host", "nccl_dev"):
        caps = _with_nccl_host(dict(caps), message)       # what _event looks the row up with
    text = caps.get(key) or message
    for i, row in enumerate(compiled.rows):
        if row.search(text):
            return i
    return None


def _with_nccl_host(caps: dict, message: str) -> dict:
    nh = nccl_host(message)
    if nh and "nccl_host" not in caps:
        caps["nccl_host"], caps["nccl_dev"] = nh[0], str(nh[1])
    return caps


_UNSET = object()      # the catalog row is not known yet: _event looks it up


def _event(ln: Line, compiled, caps: dict, tc: TimeContext, row=_UNSET) -> Event:
    rule = compiled.rule
    ev = Event(rule=rule, line=ln, caps=caps, category=rule.category, role=rule.role,
               source=ln.source, node=ln.node, rank=ln.rank, action=rule.action,
               last_resort=rule.last_resort, suggests=rule.proves == "suggests",
               explained_by=tuple(rule.explained_by),
               blame=(rule.category, rule.blame) if rule.blame else None)
    _with_nccl_host(caps, ln.message)
    if "rank" in caps and caps["rank"].isdigit():
        ev.rank = int(caps["rank"])
    if "pci" in caps:
        ev.gpu = normalize_pci(caps["pci"])
    if "peer" in caps:
        ev.peer = caps["peer"]
    if "pid" in caps and caps["pid"].strip("'").isdigit():
        ev.pid = int(caps["pid"].strip("'"))
    if compiled.rows:
        if row is _UNSET:
            row = catalog_row(compiled, caps, ln.message)
        if row is not None:
            _classify(ev, compiled.rows[row])
    if rule.decode:
        decode.DECODERS[rule.decode](ev, tc)
    if ev.when is None and caps.get("at"):
        ev.when = tc.epoch(parse_stamp_text(caps["at"]))
    if ln.ts is not None:
        ev.lo, ev.hi = ln.ts, ln.ts + ln.ts_res
    elif ev.when is not None:
        ev.lo, ev.hi = ev.when, ev.when + 1.0
    else:
        ev.lo = ln.after
        ev.hi = None if ln.before is None else ln.before + 1.0
    return ev


def _classify(ev: Event, row) -> None:
    """The message catalog's row for this message says what it is."""
    ev.role = row.role
    ev.category = row.category
    if row.action is not None:
        ev.action = row.action
    ev.weak = ev.weak or row.weak
    ev.last_resort = row.last_resort
    ev.suggests = row.suggests
    if row.explained_by:
        ev.explained_by = row.explained_by
    if row.blame:
        ev.blame = (row.category, row.blame)
    if row.teardown:
        ev.tag(Tag.teardown)
    ev.catalog_row = row.where
    if row.note:
        ev.detail = row.note



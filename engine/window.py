"""filter: drop events outside the job's time window (or, without one, before the last burst of
errors) and kernel lines read twice."""
from __future__ import annotations

from collections import Counter
from typing import Optional

from .decode import Event
from .models import Bundle
from .taxonomy import Role, Source


def filter_events(events: list[Event], bundle: Bundle, st,
                  notes: Counter) -> list[Event]:
    job = bundle.job
    lo = job.start - st.window_before if job.start else None
    hi = job.end + st.window_after if job.end else None
    if lo is None and hi is None:
        lo = _last_burst(events, st.burst_gap)
        if lo is not None:
            notes["no job time window: events before the last burst of errors (more than "
                  f"{int(st.burst_gap // 3600)} h before it) were taken as earlier failures "
                  "and ignored"] += 1
    out, seen = [], set()
    for ev in events:
        if lo is not None and ev.hi is not None and ev.hi < lo:
            notes[f"{ev.line.doc}: events before the job's time window ignored"] += 1
            continue
        if hi is not None and ev.lo is not None and ev.lo > hi:
            notes[f"{ev.line.doc}: events after the job's time window ignored"] += 1
            continue
        if ev.source in (Source.kernel, Source.system):
            # The same kernel line in journal.log and dmesg.txt of one node counts once.
            key = (ev.node, ev.rule.id, ev.line.message, None if ev.lo is None else int(ev.lo))
            if key in seen:
                continue
            seen.add(key)
        out.append(ev)
    return out


def _last_burst(events: list[Event], gap: float) -> Optional[float]:
    """Without the job's time window, the failure that ended the job is the latest burst: the
    start of the last run of time-stamped error events with no silence longer than `gap`
    inside it (minus the same margin a job window has). None when nothing is time-stamped or
    it is all one burst."""
    times = sorted(e.lo for e in events if e.lo is not None and e.role != Role.context)
    if len(times) < 2:
        return None
    start = times[0]
    for a, b in zip(times, times[1:]):
        if b - a > gap:
            start = b
    return None if start == times[0] else start - 600.0



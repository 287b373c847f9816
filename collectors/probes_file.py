"""The bundle's own file, `<node>/sattrib-probes.txt`: what sattrib's node probes did and when the
node's Epilog started. Written once here (by the controller worker) and read once here (by the
evidence-folder reader); the diagnosis meets its `probe=` lines through the `probe.failed` rule.

    probe=<name> source=<kernel|gpu|dcgm|...> ok=<true|false> reason=<text|-> seconds=<s>
    snapshot trusted by <how the spool authenticated it>
    clock node_time=<epoch> controller_end=<epoch> offset_s=<node minus controller>
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

NAME = "sattrib-probes.txt"
_CLOCK = re.compile(r"^clock .*offset_s=(-?\d+(?:\.\d+)?)", re.M)


@dataclass
class ProbesFile:
    probe_lines: list[tuple[int, str]] = field(default_factory=list)   # (line number, text)
    clock_offset: Optional[float] = None       # node clock minus slurmctld's, seconds


def render(probes: list[dict], trusted_by: str, taken_at, controller_end, source_of) -> str:
    """The file's text; `source_of(probe name)`: the evidence source the probe stands for (its
    failure leaves that source missing; collectors/sources.py)."""
    lines = []
    for p in probes:
        src = source_of(p.get("name"))
        lines.append(f"probe={p.get('name')} source={src} ok={str(p.get('ok')).lower()} "
                     f"reason={p.get('reason') or '-'} seconds={p.get('seconds', 0):.2f}")
    lines.append(f"snapshot trusted by {trusted_by}")
    if isinstance(taken_at, (int, float)) and controller_end:
        # The Epilog starts as the job ends: how far this node's clock is from slurmctld's.
        lines.append(f"clock node_time={taken_at:.3f} controller_end={controller_end:.3f} "
                     f"offset_s={taken_at - controller_end:.1f}")
    return "\n".join(lines) + "\n"


def facts(text: str):
    """(line, as printed, fact) of each probe line: what the `probe.failed` rule reads."""
    return ((n, ln, ln) for n, ln in parse(text).probe_lines)


def parse(text: str) -> ProbesFile:
    out = ProbesFile()
    for n, ln in enumerate(text.split("\n"), 1):
        if ln.startswith("probe="):
            out.probe_lines.append((n, ln))
    m = _CLOCK.search(text)
    if m:
        out.clock_offset = float(m.group(1))
    return out

"""The human view of a diagnosis, in the spirit of `seff`: what broke, where, the lines that show
it, what else went wrong because of it, what is missing, what to do."""
from __future__ import annotations

import os
import re
import textwrap

import click

from .engine.hostlist import compress
from .engine.taxonomy import INFRASTRUCTURE, Blame, Category, blame_of
from .escape import visible_all
from .verdict import lines as verdict_lines

MAX_EVIDENCE_LINES = 8
MAX_SYMPTOMS = 8
WIDTH = 80                 # a terminal's columns: longer lines are wrapped, evidence cut
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _c(text: str, **style) -> str:
    if os.environ.get("NO_COLOR"):           # https://no-color.org
        return text
    return click.style(text, **style)


def _where(e: dict) -> str:
    """file:line of an evidence line: the job's own output file where sattrib knows it
    (`source_path`), else the file in the evidence folder."""
    path = e.get("source_path") or e["path"]
    if e.get("line") is not None:
        return f"{path}:{e['line']}"
    if e.get("cursor"):
        return f"{path} (cursor {e['cursor'][:24]}...)"
    if e.get("offset") is not None:
        return f"{path}@{e['offset']}"
    return path


def _short(text: str, n: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _evidence(eid: str, e: dict) -> list[str]:
    """`  e1 node-02/journal.log:6: <its text>`, the text cut to end a second line."""
    head = f"  {_c(eid, dim=True)} {_where(e)}"
    if "text" not in e:
        return [head]
    first = max(WIDTH - len(ANSI.sub("", head)) - 2, 0)
    text = _short(e["text"], first + WIDTH - 4)
    return [f"{head}: {text[:first]}".rstrip()] + ([f"    {text[first:]}"] if text[first:] else [])


def _fit(line: str) -> list[str]:
    """The line, wrapped at WIDTH columns under its own indentation (a file:line is never
    broken)."""
    if len(ANSI.sub("", line)) <= WIDTH:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent + "  ", break_long_words=False,
                         break_on_hyphens=False) or [line]


def _compress_sources(items: list) -> list:
    """["gpu:node-01", "gpu:node-02", "scheduler:job"] -> ["gpu:node-[01-02]", "scheduler:job"]."""
    by_kind: dict = {}
    for it in items:
        kind, _, node = it.partition(":")
        by_kind.setdefault(kind, []).append(node)
    out = []
    for kind, nodes in by_kind.items():
        named = [n for n in nodes if n]
        out.append(f"{kind}:{compress(named)}" if named else kind)
    return out


def _acted(acted: dict) -> list[str]:
    out = []
    inc = acted.get("incident")
    if inc:
        out.append(_c("P" + inc["line"][1:], bold=True) + f" (sattrib incidents {inc['id']})")
    esc = acted.get("escalation")
    if esc:
        jobs = ", ".join(j["job_id"] for j in esc["earlier_jobs"])
        out.append("Repeat offender: " + _c(f"{esc['culprit']}", bold=True) +
                   f" was the culprit of {esc['failures']} failed jobs in "
                   f"{esc['window_days']:g} days (earlier: {jobs}): action escalated "
                   f"{esc['from']} -> " + _c(esc["to"], bold=True))
    for a in acted.get("actions") or []:
        what = f"{a['kind']} {a['node']}" if a.get("node") else a["kind"]
        out.append(f"Done: {what}: " + _c(a["decision"], bold=True) + f" ({a['detail']})")
    return out


def _stopped(loc: dict | None, ev: dict) -> list[str]:
    """Where the job stopped (the diagnosis' localization), with the lines that show it."""
    if not loc:
        return []
    ranks = loc.get("ranks") or []
    who = " ".join(x for x in (
        ranks and f"rank{'s' if len(ranks) > 1 else ''} " + ", ".join(map(str, ranks[:16]))
        + (f" (+{len(ranks) - 16})" if len(ranks) > 16 else ""),
        loc.get("nodes") and f"on {compress(loc['nodes'])}") if x)
    out = ["Stopped at: " + _c(who or "?", bold=True), f"  {loc['how']}"]
    for eid in (loc.get("evidence") or [])[:MAX_EVIDENCE_LINES]:
        e = ev.get(eid)
        if e:
            out += _evidence(eid, e)
    return out


def render(d: dict, cluster: str | None = None, run: tuple | None = None,
           acted: dict | None = None) -> str:
    """`cluster`: the cluster it is stored under; `run`: (n, of) for a job that ran several
    times. Every field is shown with its control characters escaped: users wrote them."""
    d, cluster, acted = visible_all(d), visible_all(cluster), visible_all(acted)
    out: list[str] = []
    job = d.get("job") or {}
    head = f"Job {d.get('job_id') or '?'}"
    if run is not None:
        head += f" (run {run[0]} of {run[1]})"
    elif d.get("restart"):
        head += f" (restart {d['restart']})"
    if cluster and cluster != "default":
        head += f" on {cluster}"
    meta = ", ".join(x for x in (job.get("name"), job.get("user") and f"user {job['user']}",
                                 job.get("partition") and f"partition {job['partition']}") if x)
    if meta:
        head += f"  {meta}"
    out.append(_c(head, bold=True))
    out += [_c(ln, bold=True) for ln in verdict_lines(d, acted)]
    state = " ".join(x for x in (job.get("state"), job.get("exit_code") and
                                 f"exit {job['exit_code']}") if x)
    nodes = job.get("nodes") or []
    line2 = []
    if state:
        line2.append(f"State: {state}")
    if nodes:
        line2.append(f"Nodes: {compress(nodes)} ({len(nodes)})")
    if job.get("start"):
        line2.append(f"Ran: {job['start']} .. {job.get('end') or '?'}")
    if line2:
        ran = [x for x in line2 if x.startswith("Ran:")]
        rest = [x for x in line2 if x not in ran]
        wide = len("  ".join(line2)) > WIDTH and rest
        out += ["  ".join(rest), *ran] if wide else ["  ".join(line2)]

    outcome = d["outcome"]
    colour = {"attributed": "red", "ambiguous": "yellow", "unattributed": "blue"}[outcome]
    out.append("Outcome: " + _c(outcome.upper(), fg=colour, bold=True))
    ev = {e["id"]: e for e in d.get("evidence") or []}
    causes = ([d["root_cause"]] if d.get("root_cause") else d.get("candidates")
              or d.get("possible") or [])
    for i, c in enumerate(causes):
        label = ("Root cause" if outcome == "attributed" else f"Candidate {i + 1}"
                 if outcome == "ambiguous" else "Possible (not proven)")
        where = " ".join(x for x in (c.get("node") and f"on {c['node']}",
                                     c.get("gpu") and f"GPU {c['gpu']}",
                                     c.get("rank") is not None and f"rank {c['rank']}") if x)
        out.append(f"{label}: " + _c(f"{c['category']} {where}".strip(), bold=True))
        out.append(f"  {c['summary']}")
        for i, f in enumerate(c.get("user_frames") or []):
            label = "in your code:" if i == 0 else "called from: "
            out.append(f"  {label} " + _c(f"{f['file']}:{f['line']}", bold=i == 0) +
                       f" in {f['function']}")
            if f.get("exception"):
                out.append(f"  raised:       {_short(f['exception'])}")
        if (c.get("trust") == "job_output"
                and blame_of(c["category"], c.get("blame")) == Blame.machine):
            out.append("  evidence: the job's own output only (no kernel, GPU or scheduler record)")
        if c.get("first_seen"):
            out.append(f"  first seen {c['first_seen']}")
        shown = c.get("evidence", [])[:MAX_EVIDENCE_LINES]
        for eid in shown:
            e = ev.get(eid)
            if e:
                out += _evidence(eid, e)
        more = len(c.get("evidence", [])) - len(shown)
        if more > 0:
            out.append(f"  ... {more} more evidence lines (--json shows all)")
    if outcome == "unattributed":
        out.append("Root cause: " + _c("none proven by the evidence", bold=True))
    out += _stopped(d.get("localization"), ev)
    out.append("Action: " + _c(d["action"], bold=True))
    out += _acted(acted or {})

    syms = d.get("symptoms") or []
    if syms:
        total = sum(s.get("count", 1) for s in syms)
        out.append(f"Downstream symptoms ({total} lines):")
        for s in syms[:MAX_SYMPTOMS]:
            who = []
            if s.get("ranks"):
                who.append(f"{len(s['ranks'])} rank{'s' if len(s['ranks']) != 1 else ''}")
            if s.get("nodes"):
                who.append(f"on {len(s['nodes'])} node{'s' if len(s['nodes']) != 1 else ''}"
                           if who else f"{len(s['nodes'])} node"
                           f"{'s' if len(s['nodes']) != 1 else ''}")
            first = ev.get(s["evidence"][0]) if s.get("evidence") else None
            loc = f"  [{_where(first)}]" if first else ""
            out.append(f"  {' '.join(who) or str(s.get('count', 1)) + 'x'}: {s['summary']}"
                       f" ({s.get('count', 1)}x){_c(loc, dim=True)}")
        if len(syms) > MAX_SYMPTOMS:
            out.append(f"  ... {len(syms) - MAX_SYMPTOMS} more kinds (--json shows all)")
    comp = d.get("completeness") or {}
    if comp.get("missing"):
        miss = _compress_sources(comp["missing"])
        out.append("Missing evidence: " + ", ".join(miss[:12]) +
                   (f" ... (+{len(miss) - 12})" if len(miss) > 12 else ""))
    notes = comp.get("notes") or []
    for n in notes[:5]:
        out.append(_c(f"  note: {n}", dim=True))
    if len(notes) > 5:
        out.append(_c(f"  ... {len(notes) - 5} more notes (--json shows all)", dim=True))
    if any("text" not in e for e in d.get("evidence") or []):
        out.append("Evidence lines: withheld by the dashboard (for its admins); file:line "
                   "says where each one is")
    if d.get("order_note"):
        out.append(_c(f"Order: {d['order_note']}", dim=True))
    out.append(_c(f"rules {d['rules_version']}  engine {d['engine_version']}", dim=True))
    return "\n".join(x for line in out for x in _fit(line))

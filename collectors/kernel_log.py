"""The node's kernel log: how a node's Epilog takes it (the journal's kernel records, else the
ring buffer) and how a file is recognised as one.

Kernel evidence comes only from here. The window is the job's (`Take.since`): when its start is
not known, the last hour at most, never a day of other jobs' kernel lines (their task and file
names). The reader tells the kernel's own records from other programs' lines by their prefixes
(collectors/evidence_folder.py).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from ..engine.lineparse import clean, split_prefix
from . import probe

if TYPE_CHECKING:
    from .node_snapshot import Take

JOURNAL_NAME = "journal.jsonl"   # `journalctl -o json` records
DMESG_NAME = "dmesg.txt"         # the ring buffer, when there is no journal
JOURNAL_PROBE, DMESG_PROBE = "journalctl", "dmesg"
JOURNAL_MAX_BYTES = 32 << 20
JOURNAL_MAX_LINES = 50_000

# Names a kernel log goes by; a file so named needs fewer kernel-looking lines to count as one.
_KERNEL_NAME = re.compile(r"(journal|dmesg|kern|messages|syslog|kmsg)", re.I)
# Names of a kernel/system log that the collector or an admin put in a node folder (contract
# §1): such a file is the kernel log whatever its lines look like.
_KERNEL_FILE = re.compile(r"^(?:journal\.(?:log|txt)|dmesg.*|kern\.log.*|messages.*|syslog.*)$",
                          re.I)


def kernel_journal(since: float, until: float, deadline: float, journal_dir: str = "",
                   probes: Optional[list] = None) -> tuple[str, str]:
    """Returns (file name, text) for the kernel log of [since, until]."""
    argv = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_TRANSPORT,"
            "_HOSTNAME,SYSLOG_IDENTIFIER,_BOOT_ID,PRIORITY", f"--since=@{int(since)}",
            f"--until=@{int(until) + 1}", f"--lines={JOURNAL_MAX_LINES}", "_TRANSPORT=kernel"]
    if journal_dir:
        argv.insert(1, f"--directory={journal_dir}")
    r = probe.run(JOURNAL_PROBE, argv, deadline, max_bytes=JOURNAL_MAX_BYTES, keep_tail=True)
    if probes is not None:
        probes.append(r.record())
    if r.ok:
        return JOURNAL_NAME, r.out.decode("utf-8", "replace")
    # No journal (or it failed): the kernel ring buffer, with wall-clock stamps.
    d = probe.run(DMESG_PROBE, ["dmesg", "--time-format=iso", "--nopager"], deadline,
                  max_bytes=JOURNAL_MAX_BYTES, keep_tail=True)
    if probes is not None:
        probes.append(d.record())
    if d.ok:
        return DMESG_NAME, d.out.decode("utf-8", "replace")
    return "", ""


def take(ctx: Take) -> dict[str, str]:
    name, text = kernel_journal(ctx.since, ctx.until, ctx.deadline(), ctx.journal_dir,
                                ctx.probes)
    return {name: text} if name else {}


def is_journal_json(text: str) -> bool:
    """`journalctl -o json` records."""
    first = text.lstrip()[:2000]
    return first.startswith("{") and ("__REALTIME_TIMESTAMP" in first or '"MESSAGE"' in first)


def sniff(name: str, text: str) -> bool:
    """A kernel/system log: named as one, or most of its first lines carry a kernel or syslog
    prefix (a fifth of them, in a file whose name says kernel or journal)."""
    if _KERNEL_FILE.match(name):
        return True
    lines = [ln for ln in text.split("\n")[:300] if ln.strip()]
    if not lines:
        return False
    kern = 0
    for ln in lines:
        p = split_prefix(clean(ln))
        if p.kernel_form or (p.ident is not None and p.stamp is not None):
            kern += 1
    return kern / len(lines) >= 0.5 or bool(_KERNEL_NAME.search(name) and kern / len(lines) >= 0.2)

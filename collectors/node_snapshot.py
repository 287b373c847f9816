"""The node-side snapshot the Epilog takes for a failed job: bounded, node-local evidence.

Each evidence source a node holds says how it is taken (collectors/sources.py, `take`): the
kernel log of the job's window (collectors/kernel_log.py), `nvidia-smi -q -x`, `dcgmi health -c`
(when installed), InfiniBand port state and error counters from sysfs. Every command runs with
its own deadline inside one overall budget (collectors.probe). A probe that fails or times out is
recorded in `probes`, never read as a hardware fault.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import sources
from .spool import FORMAT

LOOKBACK_MAX_S = 3600.0        # of kernel log taken when the job's start is unknown


@dataclass
class Take:
    """What a source's `take` gets: the window, a deadline for its one step, where things are
    on this node, and the list its probes' records go in."""
    since: float
    until: float
    deadline: Callable[[], float]
    journal_dir: str = ""
    ib_root: str = "/sys/class/infiniband"
    probes: list = field(default_factory=list)


def collect(job_id: str, restart: int, node: str, uid: Optional[int], start: Optional[float],
            deadline: float, *, probe_timeout: float = 8.0, journal_dir: str = "",
            journal_margin: float = 600.0, journal_lookback: float = LOOKBACK_MAX_S,
            ib_root: str = "/sys/class/infiniband", env_exit: str = "") -> dict:
    now = time.time()
    notes: list[str] = []
    if start:
        since = start - journal_margin
    else:
        lookback = min(journal_lookback, LOOKBACK_MAX_S)
        since = now - lookback
        notes.append(f"the job's start time is not known here: kernel log of the last "
                     f"{lookback / 60:.0f} min only")
    ctx = Take(since, now, lambda: min(deadline, time.monotonic() + probe_timeout),
               journal_dir, ib_root)
    files: dict[str, str] = {}
    for row in sources.takes():
        files.update(row.take(ctx))
    return {
        "format": FORMAT, "job_id": str(job_id), "restart": int(restart), "node": node,
        "host": socket.gethostname(), "uid": uid, "taken_at": now, "since": since,
        "exit": env_exit, "probes": ctx.probes, "files": files, "notes": notes,
    }

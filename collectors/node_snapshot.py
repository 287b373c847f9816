"""The node-side snapshot the Epilog takes for a failed job: bounded, node-local evidence.

- kernel journal: `journalctl _TRANSPORT=kernel -o json` from the job's start (minus a margin)
  to now; `dmesg` when there is no journal. Kernel evidence comes only from here. The window is
  the job's: when its start is not known, the last LOOKBACK_MAX_S at most (the notes say so),
  never a day of other jobs' kernel lines (their task and file names).
- `nvidia-smi -q -x`, `dcgmi health -c -j` (when installed), InfiniBand port state and error
  counters from sysfs.
Every command runs with its own deadline inside one overall budget (collectors.probe). A probe
that fails or times out is recorded in `probes`, never read as a hardware fault.
"""
from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Optional

from . import probe
from .spool import FORMAT

JOURNAL_MAX_BYTES = 32 << 20
JOURNAL_MAX_LINES = 50_000
SMI_MAX_BYTES = 16 << 20
LOOKBACK_MAX_S = 3600.0        # of kernel log taken when the job's start is unknown
KERNEL_FILES = ("journal.jsonl", "dmesg.txt")    # the names kernel_journal gives the node's log


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def kernel_journal(since: float, until: float, deadline: float, journal_dir: str = "",
                   probes: Optional[list] = None) -> tuple[str, str]:
    """Returns (file name, text) for the kernel log of [since, until]."""
    argv = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_TRANSPORT,"
            "_HOSTNAME,SYSLOG_IDENTIFIER,_BOOT_ID,PRIORITY", f"--since=@{int(since)}",
            f"--until=@{int(until) + 1}", f"--lines={JOURNAL_MAX_LINES}", "_TRANSPORT=kernel"]
    if journal_dir:
        argv.insert(1, f"--directory={journal_dir}")
    r = probe.run("journalctl", argv, deadline, max_bytes=JOURNAL_MAX_BYTES, keep_tail=True)
    if probes is not None:
        probes.append(r.record())
    if r.ok:
        return "journal.jsonl", _text(r.out)
    # No journal (or it failed): the kernel ring buffer, with wall-clock stamps.
    d = probe.run("dmesg", ["dmesg", "--time-format=iso", "--nopager"], deadline,
                  max_bytes=JOURNAL_MAX_BYTES, keep_tail=True)
    if probes is not None:
        probes.append(d.record())
    if d.ok:
        return "dmesg.txt", _text(d.out)
    return "", ""


def ib_ports(root: str = "/sys/class/infiniband", max_files: int = 4000) -> str:
    """Port state and error counters of every HCA, flattened `path<TAB>value` per line."""
    base = Path(root)
    if not base.is_dir():
        return ""
    lines = []
    n = 0
    for hca in sorted(os.listdir(base)):
        ports = base / hca / "ports"
        try:
            port_names = sorted(os.listdir(ports))
        except OSError:
            continue
        for port in port_names:
            rel = f"{hca}/ports/{port}"
            files = ["state", "phys_state", "link_layer", "rate"] + [
                f"counters/{c}" for c in ("link_downed", "link_error_recovery", "symbol_error",
                                          "port_rcv_errors", "local_link_integrity_errors",
                                          "port_rcv_remote_physical_errors",
                                          "excessive_buffer_overrun_errors",
                                          "port_xmit_discards")]
            for f in files:
                n += 1
                if n > max_files:
                    return "\n".join(lines) + "\n"
                try:
                    with open(base / hca / "ports" / port / f, "rb") as fh:
                        val = fh.read(256).decode("utf-8", "replace").strip()
                except OSError:
                    continue
                lines.append(f"{rel}/{f}\t{val}")
    return "\n".join(lines) + ("\n" if lines else "")


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
    probes: list[dict] = []
    files: dict[str, str] = {}

    def step_deadline() -> float:
        return min(deadline, time.monotonic() + probe_timeout)

    name, text = kernel_journal(since, now, step_deadline(), journal_dir, probes)
    if name:
        files[name] = text
    r = probe.run("nvidia-smi", ["nvidia-smi", "-q", "-x"], step_deadline(),
                  max_bytes=SMI_MAX_BYTES)
    probes.append(r.record())
    if r.ok:
        files["nvidia-smi.xml"] = _text(r.out)
    elif r.out or r.err:
        # "Failed to initialize NVML: ..." and "Unable to determine the device handle ..."
        # are evidence in themselves.
        files["nvidia-smi.txt"] = _text(r.out + r.err)[-65536:]
    if shutil.which("dcgmi"):
        d = probe.run("dcgmi", ["dcgmi", "health", "-c"], step_deadline(), max_bytes=1 << 20)
        probes.append(d.record())
        if d.ok or d.out:
            files["dcgm.txt"] = _text(d.out)
    ib = ib_ports(ib_root)
    if ib:
        files["ibstat.txt"] = ib
    return {
        "format": FORMAT, "job_id": str(job_id), "restart": int(restart), "node": node,
        "host": socket.gethostname(), "uid": uid, "taken_at": now, "since": since,
        "exit": env_exit, "probes": probes, "files": files, "notes": notes,
    }

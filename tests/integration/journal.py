"""Build *real* systemd journal files for tests.

Entries are serialised to the Journal Export Format
(https://systemd.io/JOURNAL_EXPORT_FORMATS/) and piped through
``systemd-journal-remote -o <file>.journal -`` (Debian 12: package
systemd-journal-remote, binary /lib/systemd/systemd-journal-remote, systemd
252).  The result is a genuine journal file that ``journalctl --file`` /
``journalctl --directory`` read like any other.

Findings (systemd 252, Debian 12), verified by test_cluster_smoke.py:

* Trusted fields survive: ``_TRANSPORT=kernel``, ``_BOOT_ID``, ``_HOSTNAME``
  (and any other ``_FOO`` field given) are stored as written.  The
  ``__REALTIME_TIMESTAMP`` / ``__MONOTONIC_TIMESTAMP`` address fields of the
  export stream become the entry's timestamps, so ``journalctl -o json``
  returns exactly the ``__REALTIME_TIMESTAMP`` we wrote, and ``--since`` /
  ``--until`` filter on it.  journalctl adds ``__CURSOR`` (``s=..;i=..;b=<boot
  id>;m=..;t=..;x=..``).
* ``journalctl -k`` means ``_TRANSPORT=kernel`` **plus ``-b``**.  With
  ``--file``/``--directory`` the bare ``-b`` is *not* the running machine's
  boot but **the last boot found in the given journal files**.  So with a
  single (foreign) boot id ``-k`` returns everything; with several boot ids
  it silently returns only the newest boot's kernel messages.  To see kernel
  messages of all boots use ``_TRANSPORT=kernel`` as a match (no ``-k``), or
  ``-k -b all``, or ``-k -b <boot_id>`` for one boot.
* ``--since @<epoch>[.frac]`` / ``--until @<epoch>`` work, as do local-time
  strings ("2023-11-14 22:13:21", interpreted in the TZ of the caller).
* Entries should be written in realtime order: journalctl's --since/--until
  seek uses a bisection that assumes ordered entries within a file.
  write_journal() sorts by default.
* Each journal file written by journal-remote is preallocated to 8 MiB on
  disk (not sparse), even for 3 entries.
* Running journal-remote needs neither root nor a running systemd; the file
  is created with mode 0640.
* MESSAGE values containing a newline are written in the binary form of the
  export format (name, newline, little-endian 64-bit size, data, newline).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

JOURNAL_REMOTE_CANDIDATES = (
    "/lib/systemd/systemd-journal-remote",
    "/usr/lib/systemd/systemd-journal-remote",
)

# fixed defaults so tests are reproducible
DEFAULT_BOOT_ID = "5a77a7b0000000000000000000000001"
DEFAULT_MACHINE_ID = "5a77a7b0000000000000000000000002"


def journal_remote_binary() -> str | None:
    for c in JOURNAL_REMOTE_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("systemd-journal-remote")


def new_boot_id() -> str:
    return uuid.uuid4().hex


@dataclass
class JournalEntry:
    """One journal entry.

    realtime_usec: microseconds since the epoch (-> __REALTIME_TIMESTAMP)
    monotonic_usec: microseconds since boot; default realtime_usec - boot_time_usec
    transport: _TRANSPORT ("kernel", "syslog", "journal", "stdout", ...)
    identifier: SYSLOG_IDENTIFIER (default "kernel" for kernel transport)
    fields: extra fields (e.g. {"_PID": "1", "SYSLOG_FACILITY": "0"})
    """

    message: str
    realtime_usec: int
    transport: str = "kernel"
    identifier: str | None = None
    priority: int | None = None
    boot_id: str = DEFAULT_BOOT_ID
    hostname: str = "node01"
    monotonic_usec: int | None = None
    boot_time_usec: int | None = None
    fields: Mapping[str, str | bytes] = field(default_factory=dict)

    def to_fields(self) -> list[tuple[str, str | bytes]]:
        ident = self.identifier
        if ident is None and self.transport == "kernel":
            ident = "kernel"
        prio = self.priority
        if prio is None:
            prio = 3 if self.transport == "kernel" else 6
        mono = self.monotonic_usec
        if mono is None:
            base = self.boot_time_usec
            if base is None:
                # deterministic pseudo boot time: one day before the entry's day
                base = (self.realtime_usec // 86_400_000_000 - 1) * 86_400_000_000
            mono = max(1, self.realtime_usec - base)
        out: list[tuple[str, str | bytes]] = [
            ("__REALTIME_TIMESTAMP", str(int(self.realtime_usec))),
            ("__MONOTONIC_TIMESTAMP", str(int(mono))),
            ("_BOOT_ID", self.boot_id),
            ("_TRANSPORT", self.transport),
            ("_HOSTNAME", self.hostname),
            ("PRIORITY", str(int(prio))),
        ]
        if ident:
            out.append(("SYSLOG_IDENTIFIER", ident))
        if self.transport == "kernel":
            out.append(("SYSLOG_FACILITY", "0"))
        out.append(("MESSAGE", self.message))
        for k, v in self.fields.items():
            out.append((k, v))
        return out


def _check_name(name: str) -> None:
    # __CURSOR etc. are address fields; others must be [A-Z0-9_]
    if not name or not all(c.isupper() or c.isdigit() or c == "_" for c in name):
        raise ValueError(f"invalid journal field name {name!r}")


def export_format(entries: Iterable[JournalEntry | Mapping[str, str | bytes]]) -> bytes:
    """Serialise entries to the Journal Export Format.

    Entries may be JournalEntry objects or raw field mappings (written as is;
    include __REALTIME_TIMESTAMP yourself).
    """
    buf = bytearray()
    for e in entries:
        items = e.to_fields() if isinstance(e, JournalEntry) else list(e.items())
        for k, v in items:
            _check_name(k)
            data = v.encode() if isinstance(v, str) else bytes(v)
            if b"\n" in data or any(b < 0x20 and b not in (0x09,) for b in data):
                buf += k.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
            else:
                buf += k.encode() + b"=" + data + b"\n"
        buf += b"\n"
    return bytes(buf)


def write_journal(
    path: str | os.PathLike,
    entries: Sequence[JournalEntry | Mapping[str, str | bytes]],
    *,
    sort: bool = True,
    overwrite: bool = True,
    timeout: float = 60,
) -> Path:
    """Write ``entries`` into a real journal file at ``path`` (must end in .journal).

    If ``path`` is a directory, the file is ``<dir>/test.journal``.
    Returns the file path.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "test.journal"
    if path.suffix != ".journal":
        raise ValueError("journal file name must end with .journal (journal-remote requires it)")
    binary = journal_remote_binary()
    if binary is None:
        raise RuntimeError(
            "systemd-journal-remote not found: run tests/integration/setup-system.sh "
            "(apt-get install systemd-journal-remote)"
        )
    if path.exists():
        if not overwrite:
            raise FileExistsError(path)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    ents = list(entries)
    if sort:
        def key(e):
            if isinstance(e, JournalEntry):
                return e.realtime_usec
            return int(e.get("__REALTIME_TIMESTAMP", 0))

        ents.sort(key=key)
    data = export_format(ents)
    r = subprocess.run(
        [binary, f"--output={path}", "--compress=no", "--split-mode=none", "-"],
        input=data,
        capture_output=True,
        timeout=timeout,
    )
    if r.returncode != 0 or not path.exists():
        raise RuntimeError(
            f"systemd-journal-remote failed ({r.returncode}): {r.stderr.decode(errors='replace')}"
        )
    return path


def journalctl_json(*args: str, timeout: float = 60) -> list[dict]:
    """Run ``journalctl -o json --no-pager <args>`` and return the parsed entries.

    journalctl exits 0 with no output when nothing matches ("-- No entries --"
    goes to stdout only with -o short and friends).
    """
    r = subprocess.run(
        ["journalctl", "--no-pager", "-o", "json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise RuntimeError(f"journalctl {args} failed ({r.returncode}): {r.stderr}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]

"""The controller's job queue: EpilogSlurmctld hands every finished job to at most
`worker_concurrency` workers through a folder on the controller's local disk.

Where: `queue/` beside the diagnoses database (`/var/lib/sattrib/queue` on a system install),
SlurmUser's alone (0700). Not the spool: node Epilogs (root on every node) write there, and
it may sit on NFS, where neither `flock` nor `rename` can be relied on; the queue holds what
slurmctld told EpilogSlurmctld, which only SlurmUser may hand to the worker.

    pending/<ns>-<pid>-<job>.<run>.json   waiting, oldest name first (the name starts with the
                                          enqueue time in nanoseconds)
    claimed/...                           being diagnosed: the worker holds an exclusive flock
                                          on the file for as long as it works on it
    failed/...                            set aside after `queue_max_attempts` attempts, each
                                          attempt's reason inside
    slots/<k>                             one lock file per worker (k < worker_concurrency)
    tmp/                                  entries being written

What it guarantees: an entry is written to tmp/, fsync'ed and renamed into pending/ (whose
directory is fsync'ed too), so after a crash it is either whole in the queue or was never
acknowledged. A worker claims the oldest entry by locking it, then renaming it into claimed/;
the kernel drops the lock when the worker dies, however it dies, so an entry in claimed/ that
nobody holds is an orphan: the next claim puts it back at the end of pending/ with one more
attempt counted. An entry that failed `queue_max_attempts` times goes to failed/ with its
reasons (no poison loop); `sattrib queue --retry` puts it back. A worker runs only while it
holds a slot lock, so at most `worker_concurrency` run, and a dead worker's slot is free at
once. Memory stays bounded whatever the queue's length: a claim keeps the names of the 16
oldest entries, never the listing.
"""
from __future__ import annotations

import fcntl
import heapq
import json
import os
import re
import stat
import time
from pathlib import Path

STATES = ("pending", "claimed", "failed")
ENTRY_MAX_BYTES = 1 << 20
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_CANDIDATES = 16          # oldest names a claim considers at once


class QueueError(Exception):
    """The queue folder cannot be used safely (missing, not a folder, writable by others)."""


class Claim:
    """An entry this process holds: `fd` carries the lock, `path` is where it is in claimed/."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path, self.entry = fd, path, {}


def queue_dir(database: str) -> Path:
    """The queue sits beside the database: the controller's local disk, SlurmUser's."""
    return Path(os.path.expanduser(database)).parent / "queue"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Queue:
    def __init__(self, root: Path, create: bool = True):
        self.root = Path(root)
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)    # as the database's is
            for d in (self.root, *(self.root / s for s in (*STATES, "slots", "tmp"))):
                try:
                    os.mkdir(d, 0o700)
                except FileExistsError:
                    pass
        for d in (self.root, *(self.root / s for s in STATES)):
            self._check(d)

    @staticmethod
    def _check(d: Path) -> None:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            raise QueueError(f"{d} does not exist") from None
        if not stat.S_ISDIR(st.st_mode):
            raise QueueError(f"{d} is not a directory")
        if st.st_mode & 0o022:
            raise QueueError(f"{d} is writable by others than its owner")

    def owned(self) -> bool:
        """Whether this process's user owns the queue (only its owner may run entries)."""
        return os.lstat(self.root).st_uid == os.geteuid()

    # -- writing ------------------------------------------------------------------------------
    def enqueue(self, entry: dict) -> str:
        """Write one entry durably; its name. O(1) whatever the queue's length."""
        job = re.sub(r"[^0-9A-Za-z_]", "_", str(entry.get("job_id")))[:40]
        name = f"{time.time_ns():020d}-{os.getpid()}-{job}.{int(entry.get('restart') or 0)}.json"
        self._write(self.root / "pending", name, entry)
        return name

    def _write(self, folder: Path, name: str, entry: dict) -> None:
        tmp = self.root / "tmp" / name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            data = json.dumps(entry, sort_keys=True).encode()
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, folder / name)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- slots ------------------------------------------------------------------------------
    def slot(self, concurrency: int) -> int | None:
        """A locked descriptor on a free worker slot (0 .. concurrency-1), or None when
        running workers hold them all. A look that finds them all held is made three times
        20 ms apart: a hook or a listing may be testing a free slot just then."""
        for attempt in range(3):
            if attempt:
                time.sleep(0.02)
            for k in range(concurrency):
                fd = os.open(self.root / "slots" / str(k),
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
        return None

    def busy_slots(self) -> int:
        """How many slots running workers hold now."""
        return sum(self._held(e.path) for e in self._slot_files())

    def free_slot(self) -> bool:
        """Whether a worker could start: a slot nobody holds, or none made yet. (The hook does
        not know worker_concurrency: the worker it starts takes a slot within it, or ends.)"""
        files = self._slot_files()
        return not files or not all(self._held(e.path) for e in files)

    def set_slots(self, concurrency: int) -> None:
        """One slot file for each of `concurrency` workers, so that a hook sees a free one; the
        free ones past it (after it was lowered) removed, so that hooks do not start workers
        for slots that no longer exist."""
        for k in range(concurrency):
            os.close(os.open(self.root / "slots" / str(k),
                             os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        for e in self._slot_files():
            if int(e.name) >= concurrency and not self._held(e.path):
                os.unlink(e.path)

    def _slot_files(self) -> list:
        with os.scandir(self.root / "slots") as it:
            return [e for e in it if e.name.isdigit()]

    def _held(self, path: str) -> bool:
        """Whether a live process holds the lock on `path`. Tested with a shared lock, which
        two such tests never refuse each other (a worker taking a slot retries past one)."""
        fd = self._lock(Path(path), fcntl.LOCK_SH)
        if fd is not None:
            os.close(fd)
        return fd is None and os.path.exists(path)

    # -- claiming -----------------------------------------------------------------------------
    def claim(self, max_attempts: int) -> Claim | None:
        """The oldest entry, locked and moved to claimed/; None when the queue is empty.
        Orphans (claimed, nobody holds them) go back to the end of pending/ first."""
        for c in self._orphans():
            self.fail(c, "its worker stopped before finishing it (killed, ended by its "
                         "deadline, or the controller restarted)", max_attempts)
        for _ in range(8):                  # others may take the candidates first: look again
            names = self._oldest("pending", _CANDIDATES)
            if not names:
                return None
            for name in names:
                c = self._take(name)
                if c is not None:
                    return c
        return None

    def _oldest(self, state: str, n: int) -> list[str]:
        with os.scandir(self.root / state) as it:
            return heapq.nsmallest(n, (e.name for e in it if e.name.endswith(".json")))

    def _take(self, name: str) -> Claim | None:
        src, dest = self.root / "pending" / name, self.root / "claimed" / name
        fd = self._lock(src)
        if fd is None:
            return None
        try:
            os.rename(src, dest)            # names are never reused: still the file we locked
        except FileNotFoundError:
            os.close(fd)                    # another worker had it, and is done with it
            return None
        return self._opened(Claim(fd, dest))

    def _opened(self, c: Claim) -> Claim | None:
        """The claim with its entry read; an unreadable entry goes to failed/ as it is."""
        try:
            c.entry = self._read(c.fd)
            return c
        except ValueError:
            os.rename(c.path, self.root / "failed" / c.path.name)
            os.close(c.fd)
            return None

    @staticmethod
    def _lock(path: Path, how: int = fcntl.LOCK_EX) -> int | None:
        """A descriptor holding the lock (exclusive by default) on the file at `path`; None
        when another process holds it, or when it is gone (or is not a file we may open)."""
        try:
            fd = os.open(path, _OPEN)
        except OSError:
            return None
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if os.fstat(fd).st_nlink == 0:      # finished and removed while we waited
            os.close(fd)
            return None
        return fd

    @staticmethod
    def _read(fd: int) -> dict:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > ENTRY_MAX_BYTES:
            raise ValueError("not a regular file of at most 1 MiB")
        data = os.pread(fd, st.st_size, 0)
        try:
            entry = json.loads(data)
        except ValueError:
            raise ValueError("not JSON") from None
        env = entry.get("env") if isinstance(entry, dict) else None
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and k.startswith("SLURM_") and isinstance(v, str)
                for k, v in env.items()):
            raise ValueError("no job environment (SLURM_* strings only)")
        entry.setdefault("attempts", [])
        return entry

    def _orphans(self) -> list[Claim]:
        out = []
        for name in self._oldest("claimed", 64):
            fd = self._lock(self.root / "claimed" / name)
            if fd is None:
                continue                     # its worker is alive
            c = self._opened(Claim(fd, self.root / "claimed" / name))
            if c is not None:
                out.append(c)
        return out

    def has_work(self) -> bool:
        """An entry waits, or a claimed one has lost its worker."""
        with os.scandir(self.root / "pending") as it:
            if any(e.name.endswith(".json") for e in it):
                return True
        return not all(self._held(str(self.root / "claimed" / name))
                       for name in self._oldest("claimed", 64))

    # -- finishing ----------------------------------------------------------------------------
    def done(self, c: Claim) -> None:
        os.unlink(c.path)
        os.close(c.fd)

    def fail(self, c: Claim, why: str, max_attempts: int) -> str:
        """Count a failed attempt: back to the end of pending/, or set aside in failed/ after
        `max_attempts`. Written before the claimed file goes, so a crash in between can only
        run the job twice (a rerun replaces the same diagnosis), never lose it."""
        entry = dict(c.entry)
        entry["attempts"] = list(entry.get("attempts") or []) + [
            {"at": _iso(time.time()), "why": why[:500]}]
        job = c.path.name.split("-", 2)[-1]
        if len(entry["attempts"]) >= max_attempts:
            folder, state = self.root / "failed", "failed"
        else:
            folder, state = self.root / "pending", "pending"
        self._write(folder, f"{time.time_ns():020d}-{os.getpid()}-{job}", entry)
        os.unlink(c.path)
        os.close(c.fd)
        return state

    def retry_failed(self) -> int:
        """Every set-aside entry back to pending/, its attempts forgotten."""
        n = 0
        with os.scandir(self.root / "failed") as it:
            names = (e.name for e in it if e.name.endswith(".json"))
            for name in names:
                fd = self._lock(self.root / "failed" / name)
                if fd is None:
                    continue
                c = Claim(fd, self.root / "failed" / name)
                try:
                    c.entry = self._read(fd)
                except ValueError:
                    os.close(fd)                # unreadable: stays set aside, as it is
                    continue
                c.entry["attempts"] = []
                self._write(self.root / "pending", name, c.entry)
                self.done(c)
                n += 1
        return n

    def tidy(self, older_than_s: float = 3600) -> None:
        """Remove what an enqueue killed half-way left in tmp/."""
        now = time.time()
        with os.scandir(self.root / "tmp") as it:
            for e in it:
                try:
                    if now - e.stat(follow_symlinks=False).st_mtime > older_than_s:
                        os.unlink(e.path)
                except OSError:
                    pass

    # -- looking ------------------------------------------------------------------------------
    def listing(self, limit: int) -> dict:
        """{state: {"count": n, "entries": [the `limit` oldest, read]}} for `sattrib queue`."""
        out = {}
        for state in STATES:
            with os.scandir(self.root / state) as it:
                count = sum(1 for e in it if e.name.endswith(".json"))
            rows = []
            for name in self._oldest(state, limit):
                rows.append(self._describe(state, name))
            out[state] = {"count": count, "entries": rows}
        return out

    def _describe(self, state: str, name: str) -> dict:
        path = self.root / state / name
        row = {"name": name, "job_id": None, "restart": None, "queued_at": None,
               "attempts": 0, "why": None}
        try:
            fd = os.open(path, _OPEN)
        except FileNotFoundError:
            return dict(row, state="gone")
        try:
            if state == "claimed":
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    row["worker"] = "none (orphan: the next claim puts it back)"
                except BlockingIOError:
                    row["worker"] = "running"
            entry = self._read(fd)
        except ValueError as e:
            return dict(row, why=f"unreadable entry: {e}")
        finally:
            os.close(fd)
        tries = entry.get("attempts") or []
        return dict(row, job_id=entry.get("job_id"), restart=entry.get("restart"),
                    queued_at=entry.get("queued_at"), attempts=len(tries),
                    why=tries[-1].get("why") if tries else None)


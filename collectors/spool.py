"""The hand-off spool: node Epilogs write one snapshot per node per job run; the controller
worker reads them.

Layout: `<spool>/<cluster>/<jobid>.<restart>/<node>.snap.gz` (gzip'd JSON), written to a
temporary name and renamed, so a reader never sees half a file. Next to it,
`<node>.snap.gz.munge` holds a MUNGE credential whose payload is the snapshot's SHA-256: the
controller accepts a snapshot only if MUNGE says a trusted uid (root) made that credential for
exactly these bytes, and the file itself is owned by that uid. Job users cannot write into the
spool (it is root:<SlurmUser group> 2770), and even where they could, they cannot mint a root
MUNGE credential.

SlurmUser's group can write the spool (the controller worker deletes what it has read), so the
writer, which runs as root on the nodes, trusts no path in it: it walks the levels with
directory descriptors that never follow a symbolic link, accepts a cluster or job directory only
when root (or `spool_writer_uid`) owns it and not every user can write it, and creates its
temporary files with O_EXCL inside the directory it checked. The reader (SlurmUser) does not
follow a symlinked cluster or job directory either.

`<cluster>/.epilog/<node>/<jobid>.<restart>` marks the job runs a node's Epilog has already
taken (claim_run): a second Epilog run of the same job run does nothing.
"""
from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import probe
from .reader import SkipFile, open_regular

FORMAT = "sattrib-snapshot/1"
MAX_SNAPSHOT = 256 << 20          # compressed bytes accepted from one node
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SpoolError(Exception):
    pass


def _safe(name: str, what: str) -> str:
    if not _SAFE.match(name or ""):
        raise SpoolError(f"unsafe {what} name {name!r}")
    return name


def job_dir(spool: Path, cluster: str, job_id: str, restart: int) -> Path:
    return Path(spool) / _safe(cluster, "cluster") / f"{_safe(job_id, 'job')}.{int(restart)}"


def write_snapshot(spool: Path, cluster: str, job_id: str, restart: int, node: str,
                   snapshot: dict, deadline: float, munge: bool = True,
                   munge_socket: str = "", writer_uid: int = 0) -> Path:
    """Write one node's snapshot (and its MUNGE credential) into the job's spool directory.

    Raises SpoolError, without writing anything, when a level of the spool is a symbolic link,
    owned by someone other than root / `writer_uid` / this process, or writable by every user.
    """
    d = job_dir(spool, cluster, job_id, restart)
    name = f"{_safe(node, 'node')}.snap.gz"
    owners = {0, writer_uid, os.geteuid()}
    data = gzip.compress(json.dumps(snapshot, sort_keys=True).encode(), compresslevel=5, mtime=0)
    fds: list[int] = []
    try:
        fds.append(_open_spool_root(Path(spool), owners))
        fds.append(_enter(fds[-1], d.parent, owners))
        fds.append(_enter(fds[-1], d, owners))
        _atomic_write(fds[-1], name, data)
        if munge:
            digest = hashlib.sha256(data).hexdigest()
            argv = ["munge", "-s", digest] + (["-S", munge_socket] if munge_socket else [])
            r = probe.run("munge", argv, deadline, max_bytes=1 << 16)
            if r.ok:
                _atomic_write(fds[-1], name + ".munge", r.out)
    finally:
        for fd in fds:
            os.close(fd)
    return d / name


MARKS = ".epilog"              # <cluster>/.epilog/<node>/<job>.<restart>: runs already taken
MARK_DAYS = 7
PRUNE_EVERY_S = 3600


def claim_run(spool: Path, cluster: str, job_id: str, restart: int, node: str,
              writer_uid: int = 0) -> bool:
    """True for the first Epilog run of this job run on this node, False for any later one:
    before 26.05 Slurm may run the Epilog of a job more than once, and a second snapshot would
    replace the first while the controller reads it, or land after the controller has
    collected the run and removed its folder. The node's mark is made with O_EXCL (two runs at
    once: one wins) next to the job folders, which the controller removes, and kept MARK_DAYS.
    Raises SpoolError as write_snapshot does."""
    owners = {0, writer_uid, os.geteuid()}
    name = f"{_safe(job_id, 'job')}.{int(restart)}"
    fds: list[int] = []
    try:
        fds.append(_open_spool_root(Path(spool), owners))
        path = Path(spool)
        for level in (_safe(cluster, "cluster"), MARKS, _safe(node, "node")):
            path = path / level
            fds.append(_enter(fds[-1], path, owners))
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o640, dir_fd=fds[-1]))
        except FileExistsError:
            return False
        _prune_marks(fds[-1])
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _prune_marks(dir_fd: int, now: Optional[float] = None) -> None:
    """Marks older than MARK_DAYS go, looked for at most once an hour (a stamp's mtime)."""
    now = time.time() if now is None else now
    try:
        if now - os.stat(".pruned", dir_fd=dir_fd).st_mtime < PRUNE_EVERY_S:
            return
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(".pruned", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o640, dir_fd=dir_fd))
        os.utime(".pruned", (now, now), dir_fd=dir_fd)
        for name in os.listdir(dir_fd):
            if not name.startswith(".") and os.stat(name, dir_fd=dir_fd, follow_symlinks=False
                                                    ).st_mtime < now - MARK_DAYS * 86400:
                os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(path: Path, dir_fd: int | None = None) -> int:
    """Open a directory (by its last component when dir_fd is given) without following it."""
    name = path.name if dir_fd is not None else str(path)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            link = False
        what = "a symbolic link (not followed)" if link else "not a directory"
        raise SpoolError(f"{path} is {what}") from None


def _check_dir(fd: int, path: Path, owners: set) -> None:
    st = os.fstat(fd)
    if st.st_uid not in owners:
        raise SpoolError(f"{path} is owned by uid {st.st_uid}, not by root or the spool writer "
                         f"(uids {sorted(owners)}); remove it or set spool_writer_uid")
    if st.st_mode & stat.S_IWOTH:
        raise SpoolError(f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}); "
                         "the spool must be root:<SlurmUser group> 2770")


def _open_spool_root(spool: Path, owners: set) -> int:
    created = False
    if not os.path.lexists(spool):
        os.makedirs(spool, exist_ok=True)
        created = True
    fd = _open_dir(spool)
    try:
        _check_dir(fd, spool, owners)
        if created:
            os.fchmod(fd, 0o2770)       # whatever the umask: SlurmUser's group must delete
    except BaseException:
        os.close(fd)
        raise
    return fd


def _enter(parent_fd: int, path: Path, owners: set) -> int:
    """The directory `path` (one level below parent_fd), made when missing, checked."""
    created = False
    try:
        os.mkdir(path.name, 0o770, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        pass
    fd = _open_dir(path, parent_fd)
    try:
        _check_dir(fd, path, owners)
        if created:
            os.fchmod(fd, 0o2770)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _atomic_write(dir_fd: int, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o640, dir_fd=dir_fd)
            break
        except FileExistsError:         # someone else's file: never reuse it
            continue
    else:
        raise SpoolError(f"cannot create a temporary file for {name}")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dir_fd)   # disk full, killed: leave no half-written file
        except OSError:
            pass
        raise


def _open_job_dir(d: Path) -> int:
    """A job's spool directory, with neither it nor its cluster directory followed if a link."""
    parent = _open_dir(d.parent)
    try:
        return _open_dir(d, parent)
    finally:
        os.close(parent)


@dataclass
class Snapshot:
    node: str
    data: dict
    path: Path
    trusted_by: str        # "munge uid 0", "owner uid 0"


def read_snapshots(d: Path, job_id: str, restart: int, trusted_uids: set,
                   require_munge: bool, deadline: float, notes: list,
                   munge_socket: str = "") -> dict[str, Snapshot]:
    """Every acceptable snapshot in a job's spool directory, by node. Rejections become notes."""
    try:
        dfd = _open_job_dir(d)
    except SpoolError as e:
        notes.append(f"spool {e}")
        return {}
    except OSError as e:
        notes.append(f"spool {d}: cannot list ({e.strerror})")
        return {}
    try:
        return _read_snapshots(dfd, d, job_id, restart, trusted_uids, require_munge,
                               deadline, notes, munge_socket)
    finally:
        os.close(dfd)


def _read_snapshots(dfd: int, d: Path, job_id: str, restart: int, trusted_uids: set,
                    require_munge: bool, deadline: float, notes: list,
                    munge_socket: str) -> dict[str, Snapshot]:
    out: dict[str, Snapshot] = {}
    names = sorted(os.listdir(dfd))
    via_fd = Path(f"/proc/self/fd/{dfd}")       # the directory opened above, not its path
    for name in names:
        if not name.endswith(".snap.gz") or name.startswith("."):
            continue
        node = name[: -len(".snap.gz")]
        path = d / name
        try:
            fd, st = open_regular(name, dir_fd=dfd)
        except SkipFile as e:
            notes.append(f"snapshot from {node} rejected: {e}")
            continue
        try:
            if st.st_uid not in trusted_uids:
                notes.append(f"snapshot from {node} rejected: owned by uid {st.st_uid}, "
                             f"not a trusted writer ({sorted(trusted_uids)})")
                continue
            if st.st_size > MAX_SNAPSHOT:
                notes.append(f"snapshot from {node} rejected: {st.st_size} bytes")
                continue
            raw = os.pread(fd, st.st_size, 0)
        finally:
            os.close(fd)
        how = f"owner uid {st.st_uid}"
        cred = via_fd / (name + ".munge")
        if cred.is_file() and not cred.is_symlink():
            ok, why = _verify_munge(cred, raw, trusted_uids, deadline, munge_socket,
                                    required=require_munge)
            if not ok:
                notes.append(f"snapshot from {node} rejected: {why}")
                continue
            how = why
        elif require_munge:
            notes.append(f"snapshot from {node} rejected: no MUNGE credential")
            continue
        try:
            data = json.loads(gzip.decompress(raw))
        except (OSError, EOFError, ValueError) as e:
            notes.append(f"snapshot from {node} rejected: cut or corrupt ({e})")
            continue
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            notes.append(f"snapshot from {node} rejected: unknown format")
            continue
        if str(data.get("job_id")) != str(job_id) or int(data.get("restart", -1)) != int(restart) \
                or data.get("node") != node:
            notes.append(f"snapshot from {node} rejected: it is for job {data.get('job_id')}."
                         f"{data.get('restart')} on {data.get('node')}")
            continue
        out[node] = Snapshot(node, data, path, how)
    return out


# unmunge status codes after which the credential's MAC was verified: success, expired (a
# rerun after the TTL) and replayed (a rerun of the same job). The payload binds the snapshot's
# hash, so a replayed or old credential still proves who wrote these exact bytes.
_MUNGE_OK = {0, 15, 17}


def _verify_munge(cred: Path, raw: bytes, trusted: set, deadline: float,
                  socket: str = "", required: bool = True) -> tuple[bool, str]:
    """(accepted, how or why not). Required MUNGE fails closed: without unmunge on this host
    nothing can be verified, so nothing is accepted."""
    try:
        blob = cred.read_bytes()[: 1 << 16]
    except OSError as e:
        return False, f"cannot read MUNGE credential ({e.strerror})"
    argv = ["unmunge"] + (["-S", socket] if socket else [])
    r = probe.run("unmunge", argv, deadline, max_bytes=1 << 16, input=blob)
    if r.reason == "not installed":
        if required:
            return False, ("MUNGE required but unmunge is not installed: snapshot rejected; "
                           'install munge or set spool_auth = "owner"')
        return True, "MUNGE not installed here; owner checked"
    text, err = r.out.decode("utf-8", "replace"), r.err
    st = re.search(r"^STATUS:\s+.*\((\d+)\)", text, re.M)
    uid = re.search(r"^UID:\s+\S+\s+\((\d+)\)", text, re.M)
    payload = text.split("\n\n", 1)[1].strip() if "\n\n" in text else ""
    if not st or int(st.group(1)) not in _MUNGE_OK or not uid:
        why = (st.group(0) if st else err.decode("utf-8", "replace")).strip()[:120]
        return False, f"MUNGE credential invalid ({why})"
    if int(uid.group(1)) not in trusted:
        return False, f"MUNGE credential made by uid {uid.group(1)}"
    if payload != hashlib.sha256(raw).hexdigest():
        return False, "MUNGE credential does not match the snapshot bytes (altered)"
    return True, f"munge uid {uid.group(1)}"


def remove_job(d: Path) -> None:
    """Delete a job's spool directory and its files; a symlinked directory is not followed."""
    try:
        parent = _open_dir(d.parent)
    except (OSError, SpoolError):
        return
    try:
        dfd = _open_dir(d, parent)
        try:
            for name in os.listdir(dfd):
                try:
                    os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass
        finally:
            os.close(dfd)
        os.rmdir(d.name, dir_fd=parent)
    except (OSError, SpoolError):
        pass
    finally:
        os.close(parent)

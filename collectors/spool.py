"""The hand-off spool: node Epilogs write one snapshot per node per job run; the controller
worker reads them.

Layout: `<spool>/<cluster>/<jobid>.<restart>/<node>.snap.gz` (gzip'd JSON), written to a
temporary name and renamed, so a reader never sees half a file. Next to it,
`<node>.snap.gz.munge` holds a MUNGE credential whose payload is the snapshot's SHA-256: the
controller accepts a snapshot only if MUNGE says a trusted uid (root) made that credential for
exactly these bytes, and the file itself is owned by that uid. Job users cannot write into the
spool (it is root:<SlurmUser group> 2770), and even where they could, they cannot mint a root
MUNGE credential.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
                   munge_socket: str = "") -> Path:
    d = job_dir(spool, cluster, job_id, restart)
    for part in (d.parent, d):
        if not part.is_dir():
            part.mkdir(parents=True, exist_ok=True)
            try:
                os.chmod(part, 0o2770)     # whatever the umask: SlurmUser's group must delete
            except OSError:
                pass
    data = gzip.compress(json.dumps(snapshot, sort_keys=True).encode(), compresslevel=5, mtime=0)
    final = d / f"{_safe(node, 'node')}.snap.gz"
    _atomic_write(final, data)
    if munge:
        digest = hashlib.sha256(data).hexdigest()
        argv = ["munge", "-s", digest] + (["-S", munge_socket] if munge_socket else [])
        r = probe.run("munge", argv, deadline, max_bytes=1 << 16)
        if r.ok:
            _atomic_write(final.with_name(final.name + ".munge"), r.out)
    return final


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)              # disk full, killed: leave no half-written file
        except OSError:
            pass
        raise


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
    out: dict[str, Snapshot] = {}
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        notes.append(f"spool {d}: cannot list ({e.strerror})")
        return out
    for name in names:
        if not name.endswith(".snap.gz") or name.startswith("."):
            continue
        node = name[: -len(".snap.gz")]
        path = d / name
        try:
            fd, st = open_regular(str(path))
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
        cred = path.with_name(name + ".munge")
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
    try:
        for name in os.listdir(d):
            try:
                os.unlink(d / name)
            except OSError:
                pass
        os.rmdir(d)
    except OSError:
        pass

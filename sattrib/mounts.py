"""Which filesystem a path lives on, from /proc/self/mountinfo: SQLite's WAL mode needs shared
memory and POSIX locks that network filesystems do not give, so the database must not sit on
one."""
from __future__ import annotations

import os
from typing import Optional

MOUNTINFO = "/proc/self/mountinfo"
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
              "glusterfs", "afs", "9p", "ocfs2", "gfs2", "pvfs2", "orangefs", "fuse.sshfs",
              "fuse.glusterfs", "fuse.ceph", "fuse.cephfs", "fuse.s3fs", "fuse.rclone",
              "fuse.gcsfuse", "fuse.beegfs"}


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def _mounts(mountinfo: Optional[str] = None) -> Optional[list[tuple[str, str]]]:
    """(mount point, filesystem type) of every mount, in mountinfo's order; None when it
    cannot be read."""
    try:
        with open(mountinfo or MOUNTINFO, encoding="utf-8", errors="replace") as f:
            lines = f.read(4 << 20).splitlines()
    except OSError:
        return None
    out = []
    for ln in lines:
        left, sep, right = ln.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and tail:
            out.append((_unescape(fields[4]), tail[0]))
    return out


def fs_type(path: str, mountinfo: Optional[str] = None) -> Optional[str]:
    """The type of the filesystem holding `path` (symlinks resolved; the longest mount point
    that is a prefix of it), or None when mountinfo cannot be read."""
    d = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    mounts = _mounts(mountinfo)
    if mounts is None:
        return None
    best, best_type = "", None
    for mnt, kind in mounts:
        inside = d == mnt or d.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):      # a later mount over the same point wins
            best, best_type = mnt, kind
    return best_type


def network_mounts(mountinfo: Optional[str] = None) -> list[str]:
    """The mount points of network filesystems on this machine (the shared file systems a
    storage error's path can be placed on, by name alone: no path is looked up)."""
    return sorted({m for m, kind in _mounts(mountinfo) or [] if kind in NETWORK_FS})


def network_fs_warning(database: str, mountinfo: Optional[str] = None) -> Optional[str]:
    kind = fs_type(os.path.dirname(os.path.abspath(os.path.expanduser(database))) or "/",
                   mountinfo)
    if kind in NETWORK_FS:
        return (f"warning: the database {database} is on a network filesystem ({kind}): "
                "SQLite's WAL mode does not work there and diagnoses can be lost or corrupted; "
                "keep it on the controller's local disk (setting `database`)")
    return None

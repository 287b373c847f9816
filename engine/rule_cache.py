"""The compiled rule set, cached on disk so a command starts without parsing YAML or regexes.

Loading the rules (YAML, pydantic validation, literal extraction, catalog rows, RE2 and
Hyperscan compile) costs half a second; unpickling the result costs a few milliseconds. The
cache file is keyed by a hash of exactly what the load depends on: the bytes of every rule and
catalog file it would read (built-in and site folders, in order), the engine's own source, the
sattrib version, the Python build, the machine type and the files of the libraries whose
objects it holds (RE2, Hyperscan, pydantic, PyYAML). A different key, a corrupt or truncated
file, or one that fails to unpickle is rebuilt silently.

Where: root uses `/var/cache/sattrib` (the hooks and the controller's worker run as root);
anyone else `$XDG_CACHE_HOME/sattrib`, else `~/.cache/sattrib`. Unpickling a file is running
its code, so a cache is read only when nobody but the reader could have written it: every
directory from `/` down is opened through the previous one's fd with O_NOFOLLOW, each must be
owned by the reader or root and not group/other-writable (unless sticky, like /tmp), the cache
folder itself and the file must be owned by the reader and not group/other-writable. A file or
folder that fails is never read; the rules are then loaded from source (and the file replaced
when the folder is trusted). Files are written to an O_EXCL temporary name and renamed into
place, so a reader sees a whole file or the old one. At most KEEP_FILES files are kept, the
ones used last.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, Optional

FORMAT = b"sattrib-rule-cache 1\n"
SYSTEM_DIR = Path("/var/cache/sattrib")
ENGINE_DIR = Path(__file__).parent
# Libraries whose objects end up in the pickle or whose parsing decides its content.
LIBRARIES = ("re2", "_re2", "hyperscan", "pydantic", "pydantic_core", "yaml")


def cache_dir() -> Optional[Path]:
    if os.geteuid() == 0:
        return SYSTEM_DIR
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "sattrib"


def _library_ids() -> bytes:
    """Path, size and mtime of each library's module file (a reinstall or upgrade changes
    them); cheaper than importlib.metadata and needs no import."""
    out = []
    for name in LIBRARIES:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec and spec.origin else ""
        try:
            st = os.stat(origin) if origin else None
        except OSError:
            st = None
        out.append(f"{name}={origin}:{st.st_size if st else 0}:{st.st_mtime_ns if st else 0}")
    return "\n".join(out).encode()


def cache_key(roots: list[Path], files: Callable[[Path], list[Path]]) -> tuple[str, str]:
    """(file name, key): the name depends on which folders are loaded, the key on every
    input's bytes (`files(root)`: the inputs in a folder). Raises OSError when an input cannot
    be read (the loader then says why)."""
    from .. import __version__

    name = hashlib.sha256(repr([str(r) for r in roots]).encode()).hexdigest()[:24]
    h = hashlib.sha256(FORMAT)
    h.update(f"{__version__}\0{sys.version}\0{sys.implementation.cache_tag}\0"
             f"{os.uname().machine}\0".encode())
    h.update(_library_ids())
    for p in sorted(ENGINE_DIR.glob("*.py")) + [ENGINE_DIR / "xid_catalog.tsv",
                                                ENGINE_DIR / "xid_policy.tsv"]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for root in roots:
        h.update(b"root\0" + str(root).encode() + b"\0")
        if not root.is_dir():
            continue
        for p in files(root):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return name + ".pickle", h.hexdigest()


# ---------------------------------------------------------------------------- trusted paths

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _safe_ancestor(st: os.stat_result, euid: int) -> bool:
    """A directory above the cache folder: only its owner or root can change it, or it is
    sticky (like /tmp: others cannot rename or remove what is ours in it)."""
    writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return st.st_uid in (euid, 0) and (not writable_by_others or st.st_mode & stat.S_ISVTX)


def _private(st: os.stat_result, euid: int) -> bool:
    return st.st_uid == euid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def open_trusted_dir(path: Path, create: bool) -> Optional[int]:
    """An fd on path, reached from / without following a symlink, or None when path is
    missing (and not created) or some directory on the way could be changed by another user."""
    if not path.is_absolute():
        return None
    euid = os.geteuid()
    parts = path.parts[1:]
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o755 if euid == 0 else 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            if not (_private(st, euid) if last else _safe_ancestor(st, euid)):
                return None
        out, fd = fd, -1
        return out
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def read(dir_fd: int, name: str, key: str):
    """The cached object, or None when the file is missing, untrusted, stale or corrupt."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st, os.geteuid()):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    head = FORMAT + key.encode() + b"\n"
    if not data.startswith(head) or len(data) < len(head) + 64:
        return None
    digest, payload = data[len(head):len(head) + 64], data[len(head) + 64:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    try:
        return pickle.loads(payload)
    except Exception:   # a damaged payload can raise almost anything; it is rebuilt
        return None


def write(dir_fd: int, name: str, key: str, obj) -> None:
    """Best effort: a cache that cannot be written only costs the next start its speed."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = (FORMAT + key.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
            + payload)
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass


KEEP_FILES = 8        # cache files kept per folder: one per set of rule folders in use
STALE_TMP_S = 3600   # a temporary file this old was left by a writer that died


def prune(dir_fd: int, keep: int = KEEP_FILES) -> None:
    """Every distinct set of rule folders (a site folder, a `--rules-dir`) leaves its own file:
    keep the `keep` used most recently (a read touches its file), drop the rest and any
    temporary file a dead writer left. Best effort, like the cache itself."""
    import time
    files, now = [], time.time()
    try:
        with os.scandir(dir_fd) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if e.name.endswith(".pickle") and not e.name.startswith("."):
                    files.append((st.st_mtime_ns, e.name))
                elif e.name.startswith(".") and ".pickle." in e.name and \
                        now - st.st_mtime > STALE_TMP_S:
                    files.append((-1, e.name))
        stale = [n for t, n in files if t < 0]
        stale += [n for _, n in sorted((f for f in files if f[0] >= 0), reverse=True)[keep:]]
        for name in stale:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def cached(build: Callable[[], object], roots: list[Path],
           files: Callable[[Path], list[Path]], kind: type, where: Optional[Path] = None):
    """build() through the cache in `where` (default: cache_dir()), keyed by the input files
    under `roots` (cache_key); a cached object that is not a `kind` is built again. What is
    built is cached only when it has no `problems` (a load that skipped site files)."""
    where = where or cache_dir()
    try:
        name, key = cache_key(roots, files)
    except OSError:
        where = None                     # an unreadable input: the loader reports it
    dir_fd = open_trusted_dir(where, create=True) if where else None
    try:
        if dir_fd is not None:
            rs = read(dir_fd, name, key)
            if isinstance(rs, kind):
                try:
                    os.utime(name, dir_fd=dir_fd, follow_symlinks=False)   # used: kept
                except OSError:
                    pass
                return rs
        rs = build()
        if dir_fd is not None and not rs.problems:
            rs.prefilter                 # compiled now, so the cache holds the database too
            write(dir_fd, name, key, rs)
            prune(dir_fd)
        return rs
    finally:
        if dir_fd is not None:
            os.close(dir_fd)

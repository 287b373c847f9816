"""Run a hook with its stdout and stderr on its log, opened without following a symbolic link.

The installed wrappers run `python -I -m sattrib.slurm_hooks.launch LOG MODULE`. LOG is opened
for appending with O_NOFOLLOW (the hooks run as root on the nodes, and a log replaced by a
symbolic link must not turn into a write somewhere else), then MODULE's main() runs with both
streams on it, so that an import error or a traceback lands in the log too. A log that cannot
be opened safely (a symbolic link, a FIFO, a hard link, no permission) becomes /dev/null.
"""
from __future__ import annotations

import importlib
import os
import stat
import sys

LOG_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
             | os.O_NOCTTY | os.O_CLOEXEC)


def open_log(path: str) -> int:
    """A descriptor appending to the regular file `path`, else one on /dev/null."""
    try:
        fd = os.open(path, LOG_FLAGS, 0o640)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        return fd
    os.close(fd)                    # a hard link could point at any file on the filesystem
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sattrib.slurm_hooks.launch LOG MODULE", file=sys.stderr)
        return 2
    log_path, module = args
    fd = open_log(log_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        hook = importlib.import_module(module)
    except ImportError as e:
        print(f"cannot import the hook module: {e}", file=sys.stderr)
        return 1
    return hook.main()


if __name__ == "__main__":
    sys.exit(main())

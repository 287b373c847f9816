"""The user's own frames: the innermost Python traceback frames, in the rank output, that are the
job's code rather than an installed package, the standard library or torch.

For an application error or an out-of-memory error the engineer wants the line in their own code
(`packed.py`, line 118), not the forty frames of the framework around it. The traceback printed
just before the root evidence line is read back from the evidence file (the reader keeps only
the lines that rules match) and its frames are filtered.
"""
from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path
from typing import Optional

from .reader import SkipFile, open_regular

MAX_FRAMES = 3            # innermost user frames kept
LOOKBACK = 400            # lines before the error line searched for its traceback
BEFORE_OFFSET = 256 << 10  # bytes before the error line's offset read back when it has one
SCAN_CAP = 64 << 20       # bytes read from the start when only the line number is known

# `  File "/w/train.py", line 118, in step`, also after a `[rank3]:` or `node-01: 0:` prefix.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s(]+)')
# Where one traceback ends and an earlier one (of a chained exception, another rank) begins.
STOP = re.compile(r"Traceback \(most recent call last\)|During handling of the above exception|"
                  r"The above exception was the direct cause")

_NOT_USER = re.compile(
    r"/(site|dist)-packages/"            # installed packages
    r"|/lib(64)?/python\d+(\.\d+)?/"      # the standard library
    r"|(^|/)torch/"                       # torch internals from a source checkout
    r"|^<")                               # <frozen importlib._bootstrap>, <string>


def is_user_file(path: str) -> bool:
    return not _NOT_USER.search(path)


def frames_before(lines: list[str]) -> list[dict]:
    """Frames of the traceback that ends at the last of `lines` (the error line): innermost
    first, only the user's own, at most MAX_FRAMES."""
    found: list[dict] = []
    for text in reversed(lines[:-1]):
        if STOP.search(text):
            break
        m = FRAME.search(text)
        if m:
            found.append({"file": m["file"], "line": int(m["line"]), "function": m["function"]})
    return [f for f in found if is_user_file(f["file"])][:MAX_FRAMES]


def _lines_up_to(fd: int, line: Optional[int], offset: Optional[int]) -> list[str]:
    """The LOOKBACK lines that end with the error line (given by byte offset or line number)."""
    if offset is not None:
        start = max(0, offset - BEFORE_OFFSET)
        data = os.pread(fd, offset - start + (64 << 10), start)
        head, rest = data[:offset - start], data[offset - start:]
        text = head + rest.split(b"\n", 1)[0]
        lines = text.decode("utf-8", "replace").split("\n")
        return (lines[1:] if start else lines)[-LOOKBACK:]
    if not line:
        return []
    last: deque = deque(maxlen=LOOKBACK)
    with os.fdopen(os.dup(fd), "rb") as f:
        read = 0
        for n, raw in enumerate(f, 1):
            read += len(raw)
            last.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
            if n == line:
                return list(last)
            if read > SCAN_CAP:
                break
    return []


def user_frames(folder: Path, path: str, line: Optional[int], offset: Optional[int],
                owner: Optional[int] = None) -> list[dict]:
    """The user's innermost frames above the error line at `path` (relative to `folder`).
    Nothing when the file cannot be read safely or holds no Python traceback there."""
    if not path or ".." in Path(path).parts:
        return []
    dir_fd = None
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # Every folder on the way is opened without following links, as the reader does.
        parts = Path(path).parts
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd, _ = open_regular(parts[-1], dir_fd=dir_fd, owner=owner)
    except (OSError, SkipFile):
        return []
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    try:
        if os.pread(fd, 2, 0) == b"\x1f\x8b":
            return []                      # compressed: a traceback there is not read back
        return frames_before(_lines_up_to(fd, line, offset))
    except OSError:
        return []
    finally:
        os.close(fd)

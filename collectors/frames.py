"""The user's own frames: the innermost Python traceback frames, in the rank output, that are the
job's code rather than an installed package, the standard library or torch.

For an application error or an out-of-memory error the engineer wants the line in their own code
(`packed.py`, line 118), not the forty frames of the framework around it. The traceback printed
just before the root evidence line is read back from the evidence file (the reader keeps only
the lines that rules match) and its frames are filtered; output_lines.user_frames reads it from
a bundle.
"""
from __future__ import annotations

import re
from collections import deque
from typing import Optional

MAX_FRAMES = 3            # innermost user frames kept
LOOKBACK = 400            # lines before the error line searched for its traceback
LOOKAHEAD = 60            # lines after it searched for the traceback it re-raises
BEFORE_OFFSET = 256 << 10  # bytes before the error line's offset read back when it has one
SCAN_CAP = 64 << 20       # bytes read from the start when only the line number is known

# `  File "/w/train.py", line 118, in step`, also after a `[rank3]:` or `node-01: 0:` prefix.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s(]+)')
# Where one traceback ends and an earlier one (of a chained exception, another rank) begins.
STOP = re.compile(r"Traceback \(most recent call last\)|During handling of the above exception|"
                  r"The above exception was the direct cause")
HEAD = re.compile(r"Traceback \(most recent call last\)")
# Python's words between a cause and the exception it led to (`raise ... from`, or raised while
# handling it): the cause, printed first, is the innermost.
CHAIN = re.compile(r"During handling of the above exception|The above exception was the direct cause")
# The traceback an error line re-raises, printed after it: a DataLoader worker's (`Caught
# KeyError in DataLoader worker process 3.` then `Original Traceback ...`), the root cause of a
# torchelastic ChildFailedError (`traceback : Traceback ...`, when the child recorded it).
INNER = re.compile(r"Original Traceback \(most recent call last\)|"
                   r"traceback\s*:\s*Traceback \(most recent call last\)")
# An exception line, after a `[rank3]:` or `node-01: 0:` prefix: `KeyError: 'input_ids'`.
EXCEPTION = re.compile(r"^(?:\[[^\]]*\]:|[\w.-]+: ?\d*:)?\s*(?P<type>(?:[A-Za-z_]\w*\.)*"
                       r"[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Fault))(?::\s?(?P<msg>.*))?$")

_NOT_USER = re.compile(
    r"/(site|dist)-packages/"            # installed packages
    r"|/lib(64)?/python\d+(\.\d+)?/"      # the standard library
    r"|(^|/)torch/"                       # torch internals from a source checkout
    r"|^/usr/(local/)?bin/"               # installed entry points (torchrun, deepspeed)
    r"|^<")                               # <frozen importlib._bootstrap>, <string>


def is_user_file(path: str) -> bool:
    return not _NOT_USER.search(path)


def _frame(m) -> dict:
    return {"file": m["file"], "line": int(m["line"]), "function": m["function"]}


def _backward(lines: list[str]) -> tuple[list[dict], int]:
    """Frames of the traceback that ends at the last of `lines`, innermost first, and the
    index of the line where it starts (or -1)."""
    found: list[dict] = []
    for i in range(len(lines) - 2, -1, -1):
        if STOP.search(lines[i]):
            return found, i if HEAD.search(lines[i]) else -1
        m = FRAME.search(lines[i])
        if m:
            found.append(_frame(m))
    return found, -1


def _cause_above(lines: list[str], start: int) -> int:
    """The index of the exception line of the cause printed above the traceback starting at
    `start` (`The above exception was the direct cause ...`), or -1."""
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0 or not CHAIN.search(lines[i]):
        return -1
    i -= 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    return i if i >= 0 and EXCEPTION.search(lines[i]) else -1


def _forward(after: list[str]) -> tuple[list[dict], Optional[str]]:
    """The traceback the error line re-raises, printed after it (INNER), as (frames innermost
    first, its exception line); nothing when none follows within LOOKAHEAD lines."""
    start = next((i for i, t in enumerate(after[:LOOKAHEAD]) if INNER.search(t)), None)
    if start is None or any(HEAD.search(t) and not INNER.search(t) for t in after[:start]):
        return [], None
    frames: list[dict] = []
    for text in after[start + 1:start + 1 + LOOKBACK]:
        m = FRAME.search(text)
        if m:
            frames.append(_frame(m))
            continue
        e = EXCEPTION.search(text)
        if e:
            return frames[::-1], text.strip()
        if frames and text.startswith((" ", "\t", "[")):
            continue                      # the source line under a frame, or its ^^^ marks
        if text.strip():
            break
    return frames[::-1], None


def innermost(lines: list[str], after: list[str] = ()) -> tuple[list[dict], Optional[str]]:
    """The user's own frames of the innermost traceback behind the error line (the last of
    `lines`), innermost first, at most MAX_FRAMES, followed by those of the tracebacks around
    it; and the innermost exception line (None when it is the error line itself).

    Innermost: the traceback the error line re-raises (a DataLoader worker's `Original
    Traceback`, a ChildFailedError's root cause), else the first cause of a chain (`The above
    exception was the direct cause of the following exception`)."""
    frames, start = _backward(lines)
    exception = None
    chain: list[list[dict]] = [frames]
    while start >= 0:
        at = _cause_above(lines, start)
        if at < 0:
            break
        exception = lines[at].strip()
        frames, start = _backward(lines[:at + 1])
        chain.insert(0, frames)
    inner, raised = _forward(list(after))
    if raised or inner:
        chain.insert(0, inner)
        exception = raised or exception
    mine = [f for fs in chain for f in fs if is_user_file(f["file"])]
    return mine[:MAX_FRAMES], exception


def frames_before(lines: list[str]) -> list[dict]:
    """Frames of the traceback that ends at the last of `lines` (the error line): innermost
    first, only the user's own, at most MAX_FRAMES."""
    return innermost(lines)[0]


def lines_around(pread, line: Optional[int], offset: Optional[int]
                  ) -> tuple[list[str], list[str]]:
    """The LOOKBACK lines that end with the error line (given by byte offset or line number),
    and the LOOKAHEAD lines after it. `pread(n, offset)` reads the file (or a view of it)."""
    if offset is not None:
        start = max(0, offset - BEFORE_OFFSET)
        data = pread(offset - start + (64 << 10), start)
        head, rest = data[:offset - start], data[offset - start:]
        first, _, after = rest.partition(b"\n")
        lines = (head + first).decode("utf-8", "replace").split("\n")
        return ((lines[1:] if start else lines)[-LOOKBACK:],
                after.decode("utf-8", "replace").split("\n")[:LOOKAHEAD])
    if not line:
        return [], []
    return _split(frames_source_lines(pread, {line, line + LOOKAHEAD}, partial=True), line)


def _split(got: dict, line: int) -> tuple[list[str], list[str]]:
    """(the lines up to `line`, the LOOKAHEAD lines after it) of frames_source_lines(...,
    {line, line + LOOKAHEAD}, partial=True)."""
    end = got.get("end", line + LOOKAHEAD)
    if end < line:
        return [], []
    window = got.get(line + LOOKAHEAD, [])
    return got.get(line, []), window[len(window) - (end - line):]


def frames_source_lines(pread, wanted: set, partial: bool = False) -> dict:
    """For each line number in `wanted`: the LOOKBACK lines that end with it, in one pass
    from the start of the file (read at most SCAN_CAP bytes). `partial`: a line past the end
    gets the lines up to the end, and "end" the last line's number."""
    out: dict = {}
    if not wanted:
        return out
    last: deque = deque(maxlen=LOOKBACK)
    top = max(wanted)
    read = pos = n = 0
    buf = b""
    while True:
        chunk = pread(8 << 20, pos)
        pos += len(chunk)
        if chunk:
            *lines, buf = (buf + chunk).split(b"\n")
        else:
            lines, buf = ([buf] if buf else []), b""
        for raw in lines:
            n += 1
            read += len(raw) + 1
            last.append(raw.decode("utf-8", "replace").rstrip("\r"))
            if n in wanted:
                out[n] = list(last)
                if n >= top:
                    return out
            if read > SCAN_CAP:
                return out
        if not chunk or len(buf) > SCAN_CAP:
            if partial and n < top:
                out.update({w: list(last) for w in wanted if w > n}, end=n)
            return out


def frames_at(pread, hits: list) -> list[list[dict]]:
    """The user's frames above each of `hits` ((line, offset) pairs, as the evidence points
    at them: by line number, or by offset when the line is past a cut), as `user_frames`
    would find them in the file `pread` reads. Files with no `File "` at all cost one pass."""
    found = False
    pos = 0
    tail = b""
    while not found:
        chunk = pread(8 << 20, pos)
        if not chunk:
            break
        found = b'File "' in tail + chunk
        tail = chunk[-8:]
        pos += len(chunk)
    if not found:
        return [[] for _ in hits]
    by_line = frames_source_lines(pread, {n for ln, _ in hits if ln
                                          for n in (ln, ln + LOOKAHEAD)}, partial=True)
    return [with_exception(*innermost(*_split(by_line, ln))) if ln else
            with_exception(*innermost(*lines_around(pread, None, off))) if off is not None
            else [] for ln, off in hits]


def with_exception(frames: list[dict], exception: Optional[str]) -> list[dict]:
    """The frames, the innermost one with the innermost exception line (when it is not the
    error line itself)."""
    if frames and exception:
        frames[0] = dict(frames[0], exception=exception)
    return frames


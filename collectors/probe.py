"""Running a probe (nvidia-smi, journalctl, dcgmi, scontrol) with a hard deadline.

A GPU that fell off the bus can leave nvidia-smi stuck in the kernel forever, where even
SIGKILL does not end it. So every child runs in its own session (its own process group), its
output is read only until the deadline, then the group is killed and, if it still does not exit,
abandoned: we close our ends of its pipes and go on. The child never inherits the caller's
stdio, so an abandoned child cannot keep slurmd waiting on the Epilog's output. A probe that
failed or timed out is recorded as such: missing evidence, never a hardware verdict.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Optional

DEFAULT_MAX_BYTES = 64 << 20


@dataclass
class ProbeResult:
    name: str
    argv: list
    ok: bool
    reason: str                 # "" when ok; "timed out after 8.0s", "exit 9", "not installed"
    seconds: float
    returncode: Optional[int] = None
    truncated: bool = False
    out: bytes = b""
    err: bytes = b""

    def record(self) -> dict:
        d = asdict(self)
        d.pop("out")
        d["err"] = self.err[-2000:].decode("utf-8", "replace")
        return d


def run(name: str, argv: list, deadline: float, *, max_bytes: int = DEFAULT_MAX_BYTES,
        env: Optional[dict] = None, keep_tail: bool = False,
        input: Optional[bytes] = None) -> ProbeResult:
    """Run argv until `deadline` (time.monotonic()). Never raises for the child's failures.
    `input`, if given, is written to the child's stdin (small: it must fit the pipe)."""
    t0 = time.monotonic()
    budget = deadline - t0
    if budget <= 0:
        return ProbeResult(name, argv, False, "no time left in the budget", 0.0)
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL if input is None else
                             subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                             env=env)
    except FileNotFoundError:
        return ProbeResult(name, argv, False, "not installed", time.monotonic() - t0)
    except OSError as e:
        return ProbeResult(name, argv, False, f"cannot start: {e.strerror}",
                           time.monotonic() - t0)
    if input is not None:
        try:
            p.stdin.write(input[: 1 << 16])
            p.stdin.close()           # flushes: a child that read nothing breaks the pipe
        except OSError:
            pass
    out, err = bytearray(), bytearray()
    truncated = False
    sel = selectors.DefaultSelector()
    for f, buf in ((p.stdout, out), (p.stderr, err)):
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ, buf)
    timed_out = False
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = key.data
                buf += chunk
                cap = max_bytes if buf is out else 1 << 16
                if len(buf) > cap:
                    truncated = truncated or buf is out
                    if keep_tail:
                        del buf[: len(buf) - cap]
                    else:
                        del buf[cap:]
        rc = None
        if not timed_out:
            left = max(deadline - time.monotonic(), 0.0)
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        if timed_out or p.returncode is None:
            _kill_group(p)
        for f in (p.stdout, p.stderr):
            try:
                f.close()
            except OSError:
                pass
    secs = time.monotonic() - t0
    if timed_out:
        return ProbeResult(name, argv, False, f"timed out after {secs:.1f}s", secs, None,
                           truncated, bytes(out), bytes(err))
    ok = rc == 0
    reason = "" if ok else (f"killed by signal {-rc}" if rc < 0 else f"exit {rc}")
    return ProbeResult(name, argv, ok, reason, secs, rc, truncated, bytes(out), bytes(err))


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
        # Stuck in the kernel (uninterruptible): abandon it. Our pipe ends are closed by the
        # caller; init reaps it if it ever exits.
        pass

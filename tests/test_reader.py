"""Tests for the untrusted-file reader (collectors/reader.py) and the literal prefilter
(engine/matcher.py).

Everything here works on small synthetic files in tmp_path with small `Limits`, so the chunk,
segment, head/tail and hit-cap code paths are all exercised in well under a second each (the
64 MiB single-line files and the 10 GiB sparse file are the slowest, a fraction of a second).
"""
from __future__ import annotations

import gzip
import os
import socket
import stat
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from sattrib.collectors.reader import Limits, SkipFile, open_regular, read_head, scan
from sattrib.engine import matcher
from sattrib.engine.matcher import PatternError, Prefilter, check_linear, required_literals

MiB = 1 << 20

try:  # noqa: SIM105
    import hyperscan  # noqa: F401
    HAVE_HS = True
except ImportError:  # pragma: no cover - non-x86 machines
    HAVE_HS = False

# Literals of different lengths on purpose: the scanner re-scans `max_len - 1` bytes at a cut,
# so a short literal next to a long one is the interesting case.
LITS = [("NEEDLE", False), ("A_MUCH_LONGER_LITERAL_XYZ", False), ("caseless", True)]
LIT_RULES = [("r.needle",), ("r.long",), ("r.ci",)]
LINES_AFTER = {"r.needle": 3}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def make_prefilter(lits, engine: str) -> Prefilter:
    """A Prefilter on the requested engine ('hyperscan' or 're2')."""
    if engine == "re2":
        saved = sys.modules.get("hyperscan", "__absent__")
        sys.modules["hyperscan"] = None        # makes `import hyperscan` raise ImportError
        try:
            pf = Prefilter(lits)
        finally:
            if saved == "__absent__":
                del sys.modules["hyperscan"]
            else:
                sys.modules["hyperscan"] = saved
    else:
        if not HAVE_HS:
            pytest.skip("hyperscan not installed on this machine")
        pf = Prefilter(lits)
    assert pf.engine == engine
    return pf


@pytest.fixture(scope="module")
def pf_default() -> Prefilter:
    return Prefilter(LITS)


def scan_bytes(tmp_path: Path, data: bytes, pf: Prefilter, *, lit_rules=LIT_RULES,
               lines_after=None, name: str = "f.log", **limits):
    p = tmp_path / name
    p.write_bytes(data)
    return scan_path(p, pf, lit_rules=lit_rules, lines_after=lines_after, **limits)


def scan_path(p: Path, pf: Prefilter, *, lit_rules=LIT_RULES, lines_after=None, **limits):
    fd, st = open_regular(str(p))
    try:
        return scan(fd, st.st_size, pf, lit_rules,
                    LINES_AFTER if lines_after is None else lines_after, Limits(**limits))
    finally:
        os.close(fd)


def naive_hit_lines(data: bytes, lits=LITS) -> list[int]:
    """1-based numbers of the LF-separated lines holding any literal (the reference answer)."""
    out = []
    for i, ln in enumerate(data.split(b"\n")):
        for s, ci in lits:
            if (s.lower().encode() in ln.lower()) if ci else (s.encode() in ln):
                out.append(i + 1)
                break
    return out


def assert_offsets_consistent(data: bytes, res) -> None:
    """Every hit's bytes are exactly the file's bytes at its offset."""
    for h in res.hits:
        assert data[h.offset:h.offset + len(h.data)] == h.data, (h.offset, h.data[:60])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def call_with_timeout(fn, timeout: float, unblock=()):
    """Run fn() in a thread; fail (after unblocking any FIFO readers) if it does not return."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(timeout)
    elapsed = time.monotonic() - t0
    if t.is_alive():
        for fifo in unblock:          # a blocked open(O_RDONLY) on a FIFO returns once a writer
            try:                      # opens it: release the thread before failing
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"call did not return within {timeout} s (blocked)")
    return box, elapsed


# --------------------------------------------------------------------------------------------
# open_regular
# --------------------------------------------------------------------------------------------


@pytest.fixture
def root_only_file(tmp_path: Path) -> Path:
    p = tmp_path / "secret"
    p.write_bytes(b"SECRET-CONTENT NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    os.chmod(p, 0)
    if os.geteuid() == 0:
        os.chown(p, 0, 0)
    return p


def _spy_os_open(monkeypatch):
    calls = []
    real = os.open

    def spy(path, flags, *a, **kw):
        calls.append((str(path), flags))
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    return calls


@pytest.mark.parametrize("target", ["chmod000", "/etc/shadow"])
def test_open_regular_refuses_symlink_to_root_only_file(tmp_path, root_only_file, monkeypatch,
                                                       target):
    dst = str(root_only_file) if target == "chmod000" else target
    if target == "/etc/shadow" and not os.path.exists(dst):
        pytest.skip("no /etc/shadow here")
    link = tmp_path / "rank-0.stderr"
    os.symlink(dst, link)
    before = open_fds()
    calls = _spy_os_open(monkeypatch)
    with pytest.raises(SkipFile, match="symbolic link"):
        open_regular(str(link))
    monkeypatch.undo()
    # Opened once, by the link's own name, with O_NOFOLLOW and O_NONBLOCK: the kernel refuses
    # with ELOOP before the target is touched; nothing else was opened and no fd leaked.
    assert len(calls) == 1 and calls[0][0] == str(link)
    assert calls[0][1] & os.O_NOFOLLOW and calls[0][1] & os.O_NONBLOCK
    assert not calls[0][1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    assert open_fds() == before


def test_open_regular_refuses_symlink_to_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "rank-1.stderr"
    os.symlink(fifo, link)
    box, elapsed = call_with_timeout(lambda: open_regular(str(link)), 5, unblock=[str(fifo)])
    assert isinstance(box.get("error"), SkipFile), box
    assert "symbolic link" in str(box["error"])
    assert elapsed < 2


def test_open_regular_fifo_does_not_block_and_is_refused(tmp_path):
    fifo = tmp_path / "rank-2.stderr"
    os.mkfifo(fifo)
    before = open_fds()
    box, elapsed = call_with_timeout(lambda: open_regular(str(fifo)), 5, unblock=[str(fifo)])
    assert isinstance(box.get("error"), SkipFile), box
    assert "FIFO" in str(box["error"])
    assert elapsed < 2
    assert open_fds() == before


def test_open_regular_fifo_with_a_writer_is_refused(tmp_path):
    """A FIFO someone is writing into is still not read (and not waited on)."""
    fifo = tmp_path / "rank-2.stderr"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(wfd, b"NVRM: Xid (PCI:0000:3b:00): 79\n")
        box, elapsed = call_with_timeout(lambda: open_regular(str(fifo)), 5)
        assert isinstance(box.get("error"), SkipFile), box
        assert elapsed < 2
        assert os.read(rfd, 100).startswith(b"NVRM")     # the data was not consumed
    finally:
        os.close(wfd)
        os.close(rfd)


def test_open_regular_refuses_dev_null():
    box, elapsed = call_with_timeout(lambda: open_regular("/dev/null"), 5)
    assert isinstance(box.get("error"), SkipFile), box
    assert "device" in str(box["error"])


def test_open_regular_refuses_char_device_node_in_folder(tmp_path):
    dev = tmp_path / "rank-3.stderr"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))   # same as /dev/null
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot mknod here: {e}")
    with pytest.raises(SkipFile) as ei:
        open_regular(str(dev))
    # "is a device", or "cannot open" on a nodev mount: refused either way
    assert "device" in str(ei.value) or "cannot open" in str(ei.value)


def test_open_regular_refuses_socket(tmp_path):
    path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
        s.listen(1)
        box, elapsed = call_with_timeout(lambda: open_regular(str(path)), 5)
        assert isinstance(box.get("error"), SkipFile), box
        assert elapsed < 2
    finally:
        s.close()


def test_open_regular_refuses_directory(tmp_path):
    with pytest.raises(SkipFile):
        open_regular(str(tmp_path))


def test_open_regular_missing_file_is_skipfile(tmp_path):
    with pytest.raises(SkipFile, match="cannot open"):
        open_regular(str(tmp_path / "nope"))


def test_open_regular_owner_mismatch_refused(tmp_path):
    p = tmp_path / "rank-0.stderr"
    p.write_bytes(b"hello\n")
    me = os.stat(p).st_uid
    before = open_fds()
    with pytest.raises(SkipFile, match="owned by uid"):
        open_regular(str(p), owner=me + 1)
    assert open_fds() == before
    fd, st = open_regular(str(p), owner=me)
    os.close(fd)
    assert st.st_uid == me


def test_open_regular_owner_mismatch_for_root_owned_hardlink_target(tmp_path):
    """A file owned by someone else (e.g. a hard link to a root file) is refused by owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    p = tmp_path / "rank-0.stderr"
    p.write_bytes(b"data\n")
    os.chown(p, 0, 0)
    with pytest.raises(SkipFile, match="owned by uid 0"):
        open_regular(str(p), owner=4242)


def test_open_regular_regular_file_and_read_head(tmp_path):
    p = tmp_path / "a.log"
    p.write_bytes(b"line one\nline two\n")
    fd, st = open_regular(str(p))
    try:
        assert stat.S_ISREG(st.st_mode) and st.st_size == 18
        assert read_head(fd, 8) == b"line one"
        assert read_head(fd, 1000) == b"line one\nline two\n"
    finally:
        os.close(fd)


def test_read_head_gzip_and_broken_gzip(tmp_path):
    text = b"".join(b"line %d\n" % i for i in range(10000))
    p = tmp_path / "a.log.gz"
    p.write_bytes(gzip.compress(text))
    fd, _ = open_regular(str(p))
    try:
        assert read_head(fd, 4096) == text[:4096]
    finally:
        os.close(fd)
    p.write_bytes(b"\x1f\x8b" + b"\xff" * 50)
    fd, _ = open_regular(str(p))
    try:
        assert read_head(fd, 4096) == b""
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# scan: lines, CR, CRLF
# --------------------------------------------------------------------------------------------


def test_line_numbers_count_lf_only_not_cr(tmp_path, pf_default):
    data = (b"first\n"                              # 1
            b"a\rb\rc\n"                            # 2 (CRs do not start lines)
            b"x NEEDLE y\n"                         # 3
            b"50%|##   | 1/2\r100%|####| NEEDLE\n"  # 4 tqdm: hit after a CR
            b"\n"                                   # 5 empty
            b"tail CASELESS\n")                     # 6 caseless literal
    res = scan_bytes(tmp_path, data, pf_default)
    assert [h.line for h in res.hits] == [3, 4, 6]
    assert [h.data for h in res.hits] == [b"x NEEDLE y", b"100%|####| NEEDLE", b"tail CASELESS"]
    assert res.hits[0].lits == {"r.needle"}
    assert res.hits[2].lits == {"r.ci"}
    assert_offsets_consistent(data, res)
    assert res.cut == 0 and res.hits_dropped == 0 and not res.notes


def test_newlines_counted_only_up_to_the_last_kept_line(pf_default):
    """Most hits are lines the rules drop: the reader numbers only the lines it keeps, and
    counts no newline after the last of them."""
    data = (b"NEEDLE keep\n" + b"filler\n" * 1000 + b"NEEDLE dropped\n" * 50
            + b"NEEDLE keep\n" + b"plain\n" * 1000)
    counted_to = []

    class Counted(bytes):
        def count(self, sub, *where):
            counted_to.append(where[1] if len(where) > 1 else len(self))
            return bytes.count(self, sub, *where)
    res = scan(-1, len(data), pf_default, LIT_RULES, {}, Limits(),
               confirm=lambda d, lits: (lits if d.endswith(b"keep") else set(), None),
               pread=lambda n, off: Counted(data[off:off + n]))
    assert [h.line for h in res.hits] == [1, 1052]
    assert max(counted_to) <= data.index(b"plain")


def test_no_neighbour_lines_cut_out_for_a_line_whose_time_they_cannot_bound(pf_default):
    data = b"before\n" * 8 + b"x NEEDLE y\n" + b"after\n" * 8
    res = scan(-1, len(data), pf_default, LIT_RULES, LINES_AFTER, Limits(),
               pread=lambda n, off: data[off:off + n], neighbours=lambda h: False)
    h, = res.hits
    assert (h.prev, h.next) == ([], [])
    assert h.following == [b"after"] * 3          # what a rule reads on is still cut out
    res = scan(-1, len(data), pf_default, LIT_RULES, LINES_AFTER, Limits(),
               pread=lambda n, off: data[off:off + n], neighbours=lambda h: True)
    assert len(res.hits[0].prev) == len(res.hits[0].next) == Limits().context_lines


def test_cr_delimits_segment_in_tqdm_line(tmp_path, pf_default):
    line = b"\r".join(b" %d%%|%s| step" % (i, b"#" * (i // 10)) for i in range(0, 100, 5))
    line += b"\rRuntimeError NEEDLE happened\r 100%|##########|"
    data = b"before\n" + line + b"\nafter\n"
    res = scan_bytes(tmp_path, data, pf_default)
    assert len(res.hits) == 1
    h = res.hits[0]
    assert h.line == 2
    assert h.data == b"RuntimeError NEEDLE happened"
    assert b"\r" not in h.data
    assert_offsets_consistent(data, res)


@pytest.mark.parametrize("label", [b"[1,3]<stderr>:", b" 3: ", b"node-07: ", b"[default3]:"])
def test_a_launchers_label_stays_with_the_part_after_a_cr(tmp_path, pf_default, label):
    """Open MPI, srun, pdsh and torchrun label the whole line before the bar the program drew;
    the part after the bar is still that task's or host's."""
    data = b"before\n" + label + b"\r 42%|####| 105/250 [00:31<00:43]RuntimeError NEEDLE\n"
    (h,) = scan_bytes(tmp_path, data, pf_default).hits
    assert h.data == label + b" 42%|####| 105/250 [00:31<00:43]RuntimeError NEEDLE"
    text = b"x\r 42%|####| 1/2 [00:01<00:01]RuntimeError NEEDLE"      # a program's own text
    (h,) = scan_bytes(tmp_path, text, pf_default).hits
    assert h.data == b" 42%|####| 1/2 [00:01<00:01]RuntimeError NEEDLE"


def test_crlf_lines_hit_text_without_cr(tmp_path, pf_default):
    data = b"a\r\nb NEEDLE c\r\nd\r\ne caseless f\r\n"
    res = scan_bytes(tmp_path, data, pf_default)
    assert [(h.line, h.data) for h in res.hits] == [(2, b"b NEEDLE c"), (4, b"e caseless f")]


def test_last_line_without_newline(tmp_path, pf_default):
    data = b"a\nb\nkilled mid-write NEEDLE"
    res = scan_bytes(tmp_path, data, pf_default, chunk=4)
    assert [(h.line, h.data) for h in res.hits] == [(3, b"killed mid-write NEEDLE")]


def test_empty_file(tmp_path, pf_default):
    res = scan_bytes(tmp_path, b"", pf_default)
    assert res.hits == [] and res.scanned == 0 and res.cut == 0


# --------------------------------------------------------------------------------------------
# scan: chunk boundaries
# --------------------------------------------------------------------------------------------


def _lines_file(n=300, every=7, seed=0) -> bytes:
    import random
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        body = bytes(rnd.choice(b"ab c\t") for _ in range(rnd.randint(0, 60)))
        if i % every == 3:
            lit = rnd.choice([b"NEEDLE", b"A_MUCH_LONGER_LITERAL_XYZ", b"CaseLess"])
            k = rnd.randint(0, len(body))
            body = body[:k] + lit + body[k:]
        out.append(b"L%d %s" % (i, body))
    return b"\n".join(out) + b"\n"


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 25, 26, 64, 100, 257, 4096, 8 * MiB])
def test_hits_across_chunk_boundaries_found_exactly_once(tmp_path, pf_default, chunk):
    data = _lines_file()
    expect = naive_hit_lines(data)
    assert len(expect) > 30
    res = scan_bytes(tmp_path, data, pf_default, chunk=chunk, segment_max=512)
    assert [h.line for h in res.hits] == expect
    assert_offsets_consistent(data, res)
    for h in res.hits:
        assert any(s.encode().lower() in h.data.lower() for s, _ in LITS)


def test_literal_straddling_every_chunk_boundary(tmp_path, pf_default):
    """Slide a literal across a chunk boundary one byte at a time: always one hit, right line."""
    chunk = 64
    for pos in range(chunk - 30, chunk + 5):
        data = b"head line\n" + b"y" * pos + b"NEEDLE" + b"z" * 40 + b"\nlast\n"
        res = scan_bytes(tmp_path, data, pf_default, chunk=chunk, segment_max=256)
        assert [(h.line, h.lits) for h in res.hits] == [(2, {"r.needle"})], pos
        assert b"NEEDLE" in res.hits[0].data


def test_literal_straddling_chunk_boundary_inside_very_long_line(tmp_path):
    """A line much longer than chunk and segment_max; the literal crosses every cut position.

    With a single literal (overlap = len - 1) each occurrence is found exactly once.
    """
    pf = Prefilter([("NEEDLE", False)])
    for chunk, seg in [(64, 64), (256, 64), (1024, 256)]:
        for pos in range(0, 2 * chunk + 3 * seg, 3 if chunk < 1024 else 11):
            line = bytearray(b"x" * (6 * chunk + 4 * seg))
            line[pos:pos + 6] = b"NEEDLE"
            data = b"first\n" + bytes(line) + b"\nlast\n"
            res = scan_bytes(tmp_path, data, pf, lit_rules=[("r.needle",)],
                             chunk=chunk, segment_max=seg)
            assert len(res.hits) == 1, (chunk, seg, pos, [h.offset for h in res.hits])
            h = res.hits[0]
            assert h.line == 2 and b"NEEDLE" in h.data and len(h.data) <= seg
            assert_offsets_consistent(data, res)


def test_long_line_short_literal_next_to_long_literal_found_once(tmp_path, pf_default):
    dups = []
    for chunk, seg in [(64, 64), (256, 64), (1024, 256)]:
        for pos in range(0, 1500, 7):
            line = bytearray(b"x" * 3000)
            line[pos:pos + 6] = b"NEEDLE"
            data = b"first\n" + bytes(line) + b"\nlast\n"
            res = scan_bytes(tmp_path, data, pf_default, chunk=chunk, segment_max=seg)
            assert res.hits and all(h.line == 2 for h in res.hits)
            if len(res.hits) != 1:
                dups.append((chunk, seg, pos, [h.offset for h in res.hits]))
    assert dups == []


def test_long_line_real_rules_default_limits_no_duplicate(tmp_path):
    from sattrib.engine.rules import load_rules
    rs = load_rules()
    lim = Limits()
    lit = b"CUDA error: out of memory"
    end = lim.chunk - lim.segment_max - 50       # inside the re-scanned overlap
    data = b"x" * (end - len(lit)) + lit + b"y" * lim.chunk + b"\n"
    res = scan_bytes(tmp_path, data, rs.prefilter, lit_rules=rs.literal_rules, lines_after={})
    assert len(res.hits) == 1, [(h.offset, sorted(h.lits)) for h in res.hits]


# --------------------------------------------------------------------------------------------
# scan: one huge line (bounded segment, bounded memory)
# --------------------------------------------------------------------------------------------


def _write_long_line(p: Path, total: int, lit_at: int, lit: bytes = b"NEEDLE") -> None:
    block = b"x" * MiB
    with open(p, "wb") as f:
        pos = 0
        while pos < total:
            n = min(MiB, total - pos)
            buf = bytearray(block[:n])
            if pos <= lit_at < pos + n:
                k = lit_at - pos
                buf[k:k + len(lit)] = lit[: n - k]
            f.write(buf)
            pos += n
        f.write(b"\n")


@pytest.mark.parametrize("where", ["near_end", "at_start", "middle"])
def test_64mib_single_line_bounded_segment_and_memory(tmp_path, where):
    total = 64 * MiB
    lit_at = {"near_end": total - 100, "at_start": 0, "middle": total // 2 + 12345}[where]
    p = tmp_path / "long.log"
    _write_long_line(p, total, lit_at)
    pf = Prefilter([("NEEDLE", False)])
    lim = Limits()                               # production defaults: 8 MiB chunks, 16 KiB seg
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        fd, st = open_regular(str(p))
        try:
            res = scan(fd, st.st_size, pf, [("r.needle",)], {}, lim)
        finally:
            os.close(fd)
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(res.hits) == 1
    h = res.hits[0]
    assert h.line == 1
    assert b"NEEDLE" in h.data and len(h.data) <= lim.segment_max
    assert h.offset <= lit_at < h.offset + len(h.data)
    with open(p, "rb") as f:
        f.seek(h.offset)
        assert f.read(len(h.data)) == h.data
    assert res.cut == 0 and res.scanned == total + 1
    # A few chunks, never the whole line.
    assert peak < 5 * lim.chunk, f"peak {peak / MiB:.1f} MiB"
    assert elapsed < 20


def test_64mib_line_small_chunks_memory_stays_small(tmp_path):
    p = tmp_path / "long.log"
    _write_long_line(p, 64 * MiB, 64 * MiB - 10)
    pf = Prefilter([("NEEDLE", False)])
    lim = Limits(chunk=256 * 1024, segment_max=4096)
    tracemalloc.start()
    try:
        res = scan_path(p, pf, lit_rules=[("r.needle",)], lines_after={},
                        chunk=lim.chunk, segment_max=lim.segment_max)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(res.hits) == 1 and len(res.hits[0].data) <= 4096
    assert peak < 4 * MiB, f"peak {peak / MiB:.1f} MiB"


# --------------------------------------------------------------------------------------------
# scan: head + tail cut, sparse files
# --------------------------------------------------------------------------------------------


def _numbered(n: int, hits: set[int]) -> bytes:
    return b"".join(b"line %05d%s\n" % (i, b" NEEDLE" if i in hits else b"")
                    for i in range(1, n + 1))


@pytest.mark.parametrize("chunk", [64, 1000, 8192])
def test_head_tail_cut(tmp_path, pf_default, chunk):
    hit_lines = {10, 100, 2500, 4900, 4999}
    data = _numbered(5000, hit_lines)
    cap = 8192
    res = scan_bytes(tmp_path, data, pf_default, file_cap=cap, chunk=chunk, segment_max=256)
    half = cap // 2
    assert res.size == len(data)
    assert res.scanned == 2 * half
    assert res.cut == len(data) - 2 * half
    assert res.notes and any("not read" in n for n in res.notes)
    head = [h for h in res.hits if h.offset < half]
    tail = [h for h in res.hits if h.offset >= len(data) - half]
    assert len(head) + len(tail) == len(res.hits)
    # Head: real line numbers. Tail: no line numbers (the middle was not counted).
    assert [(h.line, h.data) for h in head] == [(10, b"line 00010 NEEDLE"),
                                               (100, b"line 00100 NEEDLE")]
    assert [(h.line, h.data) for h in tail] == [(None, b"line 04900 NEEDLE"),
                                               (None, b"line 04999 NEEDLE")]
    assert_offsets_consistent(data, res)
    # Line 2500 is in the unread middle.
    assert not any(b"02500" in h.data for h in res.hits)
    # Context survives in both parts.
    assert tail[0].prev[0] == b"line 04899" and tail[0].next[0] == b"line 04901"
    assert tail[1].next == [b"line 05000"]
    assert tail[0].following == [b"line 04901", b"line 04902", b"line 04903"]


def test_head_tail_keeps_complete_line_at_tail_start(tmp_path, pf_default):
    lines = [b"line %04d ....." % i for i in range(1000)]        # 16 bytes with LF
    size, cap = 16 * 1000, 4096
    k = (size - cap // 2) // 16
    lines[k] = b"NEEDLE %08d" % k
    data = b"\n".join(lines) + b"\n"
    assert len(data) == size and (size - cap // 2) % 16 == 0
    res = scan_bytes(tmp_path, data, pf_default, file_cap=cap, chunk=512, segment_max=256)
    assert [(h.line, h.offset, h.data) for h in res.hits] == [
        (None, size - cap // 2, b"NEEDLE %08d" % k)]


def test_sparse_10gib_file_head_and_tail(tmp_path, pf_default):
    p = tmp_path / "rank-0.stderr"
    size = 10 << 30
    tail_line = b"tail line NEEDLE end\n"
    with open(p, "wb") as f:
        f.write(b"head line NEEDLE\n")
        f.truncate(size)
        f.seek(size - 100)
        f.write(b"\n" + tail_line)
    t0 = time.monotonic()
    res = scan_path(p, pf_default, file_cap=MiB, chunk=64 * 1024)
    elapsed = time.monotonic() - t0
    assert elapsed < 10
    assert res.size == os.path.getsize(p)
    assert res.cut == res.size - MiB and res.scanned == MiB
    assert res.notes and "not read" in res.notes[0]
    assert [(h.line, h.offset, h.data) for h in res.hits] == [
        (1, 0, b"head line NEEDLE"), (None, size - 99, tail_line.rstrip(b"\n"))]


def test_sparse_10gib_file_default_limits_is_bounded(tmp_path, pf_default):
    """Default caps on a 10 GiB sparse file: reads 512 MiB (head + tail), not 10 GiB."""
    p = tmp_path / "rank-0.stderr"
    with open(p, "wb") as f:
        f.write(b"NEEDLE first\n")
        f.truncate(10 << 30)
    t0 = time.monotonic()
    res = scan_path(p, pf_default)
    assert time.monotonic() - t0 < 30
    assert res.scanned == Limits().file_cap and res.cut == (10 << 30) - Limits().file_cap
    assert [(h.line, h.data) for h in res.hits] == [(1, b"NEEDLE first")]


# --------------------------------------------------------------------------------------------
# scan: binary junk, gzip
# --------------------------------------------------------------------------------------------


def test_binary_junk_nul_and_invalid_utf8(tmp_path, pf_default):
    import random
    rnd = random.Random(7)
    junk = bytes(rnd.getrandbits(8) for _ in range(300_000))
    junk = junk.replace(b"\n", b"\x00")          # keep line numbering predictable
    data = (b"ok\n" + junk[:5000] + b"\x00\x00 NEEDLE \xff\xfe\xc0\xaf\xed\xa0\x80\x1b[31m\n"
            + junk + b"\n\x00\x00CASELESS\x00\n" + b"\x00" * 70_000)
    res = scan_bytes(tmp_path, data, pf_default, chunk=4096, segment_max=1024)
    assert [h.line for h in res.hits] == [2, 4]
    assert b"NEEDLE" in res.hits[0].data and len(res.hits[0].data) <= 1024
    assert res.hits[1].data == b"\x00\x00CASELESS\x00"
    assert_offsets_consistent(data, res)
    for h in res.hits:                       # callers decode with errors='replace': must not raise
        h.data.decode("utf-8", "replace")


def test_gzip_content_is_scanned(tmp_path, pf_default):
    plain = b"".join(b"line %d%s\n" % (i, b" NEEDLE" if i % 1000 == 7 else b"")
                     for i in range(1, 20001))
    p = tmp_path / "rank-0.stderr.gz"
    p.write_bytes(gzip.compress(plain))
    res = scan_path(p, pf_default, chunk=4096)
    assert res.compressed
    assert res.scanned == len(plain)
    assert [(h.line, h.data) for h in res.hits] == [
        (i, b"line %d NEEDLE" % i) for i in range(1, 20001) if i % 1000 == 7]
    assert not res.notes


def test_truncated_gzip_gives_note_not_exception(tmp_path, pf_default):
    plain = b"".join(b"line %d%s\n" % (i, b" NEEDLE" if i % 1000 == 7 else b"")
                     for i in range(1, 20001))
    gz = gzip.compress(plain)
    p = tmp_path / "rank-0.stderr.gz"
    p.write_bytes(gz[: len(gz) // 2])
    res = scan_path(p, pf_default, chunk=4096)
    assert res.compressed
    assert any("gzip" in n for n in res.notes), res.notes
    assert 0 < res.scanned < len(plain)
    # What was decompressed before the break is still scanned, with right line numbers.
    assert res.hits and all(h.data == b"line %d NEEDLE" % h.line for h in res.hits)


@pytest.mark.parametrize("data", [b"\x1f\x8b", b"\x1f\x8b\x08\x00", b"\x1f\x8b" + b"\xff" * 100,
                                  b"\x1f\x8bNEEDLE\n"])
def test_broken_gzip_headers_give_note(tmp_path, pf_default, data):
    res = scan_bytes(tmp_path, data, pf_default)
    assert res.compressed and res.hits == []
    assert any("gzip" in n for n in res.notes), res.notes


def test_gzip_bomb_is_capped(tmp_path, pf_default):
    p = tmp_path / "rank-0.stderr.gz"
    p.write_bytes(gzip.compress(b"NEEDLE at start\n" + b"\0" * (64 * MiB)))
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        res = scan_path(p, pf_default, file_cap=MiB, chunk=256 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 10
    assert res.scanned == MiB
    assert any("cut" in n for n in res.notes), res.notes
    assert [(h.line, h.data) for h in res.hits] == [(1, b"NEEDLE at start")]
    assert peak < 8 * MiB


# --------------------------------------------------------------------------------------------
# scan: hit cap, context, following lines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_hits,chunk", [(8, 64), (8, 8 * MiB), (10, 100), (400, 333)])
def test_max_hits_keeps_first_three_quarters_and_last_quarter(tmp_path, pf_default, max_hits,
                                                              chunk):
    n = 1000
    data = b"".join(b"%d NEEDLE\n" % i for i in range(n))
    res = scan_bytes(tmp_path, data, pf_default, max_hits=max_hits, chunk=chunk)
    head_n = max_hits * 3 // 4
    tail_n = max_hits - head_n
    assert len(res.hits) == max_hits
    assert [h.line for h in res.hits] == (list(range(1, head_n + 1))
                                          + list(range(n - tail_n + 1, n + 1)))
    assert res.hits_dropped == n - max_hits
    assert any(str(n - max_hits) in x and "dropped" in x for x in res.notes)
    assert_offsets_consistent(data, res)


def test_prev_and_next_nearest_first(tmp_path, pf_default):
    data = b"".join(b"ctx %02d\n" % i for i in range(1, 21)) + b"HIT NEEDLE\n" + \
        b"".join(b"after %02d\n" % i for i in range(1, 21))
    res = scan_bytes(tmp_path, data, pf_default, context_lines=4, context_bytes=200)
    (h,) = res.hits
    assert h.line == 21
    assert h.prev == [b"ctx 20", b"ctx 19", b"ctx 18", b"ctx 17"]
    assert h.next == [b"after 01", b"after 02", b"after 03", b"after 04"]
    assert h.following == [b"after 01", b"after 02", b"after 03"]


def test_prev_next_at_file_edges_and_prefix_only(tmp_path, pf_default):
    long_ctx = b"2025-06-03T16:47:31Z " + b"q" * 5000
    data = b"first NEEDLE\n" + long_ctx + b"\nlast NEEDLE"
    res = scan_bytes(tmp_path, data, pf_default, context_bytes=40)
    a, b = res.hits
    assert a.prev == [] and a.next[0] == long_ctx[:40] and len(a.next) == 2
    assert b.prev[0] == long_ctx[:40] and b.prev[1] == b"first NEEDLE" and b.next == []


@pytest.mark.parametrize("chunk", list(range(3, 80, 4)) + [4096])
def test_following_filled_across_chunk_boundary(tmp_path, pf_default, chunk):
    data = (b"".join(b"pad %d\n" % i for i in range(30)) + b"HIT NEEDLE\nf1\nf2\nf3\nf4\n"
            + b"other caseless\ng1\n")
    res = scan_bytes(tmp_path, data, pf_default, chunk=chunk, segment_max=64, context_lines=5)
    a, b = res.hits
    assert a.following == [b"f1", b"f2", b"f3"]          # r.needle has lines_after=3
    assert a.next == [b"f1", b"f2", b"f3", b"f4", b"other caseless"]
    assert a.prev[:2] == [b"pad 29", b"pad 28"]
    assert b.following == []                              # r.ci has no lines_after
    assert b.next == [b"g1"]
    assert b.prev[0] == b"f4"


def test_following_uses_the_largest_lines_after_of_the_hit_rules(tmp_path, pf_default):
    data = b"NEEDLE and caseless\n1\n2\n3\n4\n5\n6\n"
    res = scan_bytes(tmp_path, data, pf_default, lines_after={"r.needle": 2, "r.ci": 5})
    (h,) = res.hits
    assert h.lits == {"r.needle", "r.ci"}
    assert h.following == [b"1", b"2", b"3", b"4", b"5"]


def test_following_after_a_line_longer_than_a_chunk(tmp_path, pf_default):
    big = b"L" * 100_000
    data = b"a\nhit NEEDLE\n" + big + b"\nf2\nf3\nf4\n"
    res = scan_bytes(tmp_path, data, pf_default, chunk=4096, segment_max=1024)
    (h,) = res.hits
    assert h.following == [big[:4096], b"f2", b"f3"]
    assert h.next[1:4] == [b"f2", b"f3", b"f4"]


# --------------------------------------------------------------------------------------------
# Prefilter: both engines
# --------------------------------------------------------------------------------------------

ENGINE_LITS = [("abcab", False), ("cab", False), ("XID", True), ("NVRM: Xid (", False),
               ("é", False), ("NEEDLE", False)]


def test_python_fallback_is_selected_without_hyperscan():
    pf = make_prefilter(ENGINE_LITS, "re2")
    assert pf.engine == "re2"
    assert pf.max_len == len("NVRM: Xid (")


def test_prefilter_engines_agree_on_bytes():
    import random
    hs = make_prefilter(ENGINE_LITS, "hyperscan")
    py = make_prefilter(ENGINE_LITS, "re2")
    rnd = random.Random(5)
    for _ in range(1500):
        buf = bytes(rnd.choice(b"abcXxiIdD\n ") for _ in range(rnd.randint(0, 200)))
        if rnd.random() < 0.2:
            buf += "é NVRM: Xid (".encode()
        assert hs.scan(buf) == py.scan(buf), buf
    # overlapping and nested literals are all reported, sorted by end offset
    assert py.scan(b"abcabcab") == hs.scan(b"abcabcab") == [(5, 0), (5, 1), (8, 0), (8, 1)]
    assert py.scan(b"xid Xid XID") == [(3, 2), (7, 2), (11, 2)]


def test_prefilter_empty_literal_list():
    pf = Prefilter([])
    assert pf.scan(b"anything") == []


def test_prefilter_python_fallback_accepts_memoryview():
    hs = make_prefilter(ENGINE_LITS, "hyperscan")
    py = make_prefilter(ENGINE_LITS, "re2")
    buf = b"xx\nabcab NEEDLE\nzz"
    mv = memoryview(buf)[1:]
    assert py.scan(mv) == hs.scan(mv) == hs.scan(buf[1:])


@pytest.mark.parametrize("engine", ["hyperscan", "re2"])
def test_scan_engines_same_hits_single_chunk_file(tmp_path, engine):
    """A file that fits one chunk and ends with LF: both engines give the same hits."""
    pf = make_prefilter(LITS, engine)
    data = _lines_file(seed=3)
    res = scan_bytes(tmp_path, data, pf, segment_max=512)
    assert [h.line for h in res.hits] == naive_hit_lines(data)
    assert [(h.line, h.offset, h.data, h.lits) for h in res.hits] == [
        (h.line, h.offset, h.data, h.lits)
        for h in scan_bytes(tmp_path, data, make_prefilter(LITS, "hyperscan"),
                            segment_max=512).hits]


@pytest.mark.parametrize("case", ["chunked", "unterminated_last_line"])
def test_scan_engines_same_line_hits(tmp_path, case):
    data = _lines_file(seed=4)
    kw = {"chunk": 100, "segment_max": 512} if case == "chunked" else {}
    if case == "unterminated_last_line":
        data += b"killed NEEDLE"
    got = {}
    for engine in ("hyperscan", "re2"):
        pf = make_prefilter(LITS, engine)
        res = scan_bytes(tmp_path, data, pf, **kw)
        got[engine] = [(h.line, h.offset, h.data, h.lits) for h in res.hits]
    assert got["re2"] == got["hyperscan"]
    assert [x[0] for x in got["hyperscan"]] == naive_hit_lines(data)


# --------------------------------------------------------------------------------------------
# check_linear / required_literals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern,what", [
    (r"(a+)\1", "back-reference"),
    (r"(?P<x>abc)(?P=x)", "back-reference"),
    (r"foo(?=bar)", "look-ahead"),
    (r"foo(?!bar)", "negative look"),
    (r"(?<=kernel: )NVRM", "look-ahead/look-behind"),
    (r"(?<!user )Xid", "negative look"),
    (r"(?>abc)def", "atomic group"),
    (r"abc++", "possessive"),
    (r"(a)?(?(1)abc|def)", "conditional"),
])
def test_check_linear_rejects_non_linear_constructs(pattern, what):
    with pytest.raises(PatternError, match=what):
        check_linear(pattern)


@pytest.mark.parametrize("pattern", [r"[", r"(abc", r"abc)", r"a{2,1}"])
def test_check_linear_rejects_bad_syntax(pattern):
    with pytest.raises(PatternError, match="invalid"):
        check_linear(pattern)


@pytest.mark.parametrize("pattern", [
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]+)\): (?P<xid>\d+)",
    r"(?i)out of memory", r"(foo|bar)+baz", r"x{3,}yz[abc]*",
])
def test_check_linear_accepts_plain_patterns(pattern):
    check_linear(pattern)


def test_required_literals():
    assert required_literals(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]+)\): (?P<xid>\d+)") == [
        "NVRM: Xid (PCI:"]
    assert required_literals(r"(?i)Out Of Memory") == ["out of memory"]
    assert required_literals(r"x(abcd|efgh)+y") == ["abcd", "efgh"]
    # longest shortest member wins: the alternation (13 chars) over the 12-char prefix
    assert required_literals(r"CUDA error: (?:out of memory|unknown error)") == [
        "out of memory", "unknown error"]
    with pytest.raises(PatternError, match="literal"):
        required_literals(r"ab|cd")
    with pytest.raises(PatternError, match="literal"):
        required_literals(r"\d+\s+\w+")


def _prefilter_finds(pattern: str, line: str) -> bool:
    rx, lits, caseless = matcher.compile_rule_pattern(pattern)
    assert rx.search(line), "test premise: the rule itself matches the line"
    pf = Prefilter([(s, caseless) for s in lits])
    return bool(pf.scan(line.encode()))


def test_required_literals_sound_for_global_ignore_case():
    assert _prefilter_finds(r"(?i)gpu has fallen off", "kernel: GPU HAS FALLEN OFF the bus")


def test_required_literals_sound_for_scoped_ignore_case():
    assert _prefilter_finds(r"kernel: (?i:gpu has fallen)", "kernel: GPU HAS FALLEN")


def _writer_waiting_on(fifo: Path):
    """A process blocked in open(fifo, O_WRONLY): it goes on (and prints) only when someone
    opens the FIFO for reading, even with O_NONBLOCK and even for an instant."""
    import subprocess
    p = subprocess.Popen(["sh", "-c", 'exec 3>"$1"; echo opened', "sh", str(fifo)],
                         stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    assert p.poll() is None
    return p


def test_open_regular_looks_without_opening_a_fifo(tmp_path):
    """Looking is not opening: a FIFO (or a device: its driver's open would run) is refused
    from what the name is, before any open for reading; the writer waiting on it stays
    blocked."""
    fifo = tmp_path / "rank-4.stderr"
    os.mkfifo(fifo)
    writer = _writer_waiting_on(fifo)
    try:
        with pytest.raises(SkipFile, match="FIFO"):
            open_regular(str(fifo))
        time.sleep(0.3)
        assert writer.poll() is None, "open_regular opened the FIFO"
    finally:
        writer.kill()
        writer.wait()


def test_open_regular_never_opens_a_device(tmp_path):
    """A device through a symlinked folder (`d` -> /dev; the last component is not a link, so
    O_NOFOLLOW does not stop it): refused as a device by one O_PATH open, which runs no
    driver; it is never opened for reading."""
    link = tmp_path / "d"
    os.symlink("/dev", link)
    calls = []
    real = os.open

    def spy(path, flags, *a, **kw):
        calls.append((str(path), flags))
        return real(path, flags, *a, **kw)
    os.open = spy
    try:
        with pytest.raises(SkipFile, match="device"):
            open_regular(str(link / "null"))
    finally:
        os.open = real
    assert [f & os.O_PATH for _, f in calls] == [os.O_PATH], calls

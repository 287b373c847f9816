"""Whole-folder hostile-input tests (CONTRACT §4) through `sattrib.analysis.analyze_folder`.

Each test copies one of the example cases from /work/shared/cases into tmp_path, plants hostile
content in it (fake kernel lines in rank output, symlinks to root-only files, FIFOs, a 1 GiB
single line, binary junk, 10,000 files) and checks that analysis finishes promptly, never
crashes, never takes rank output for kernel evidence, keeps the right diagnosis, and says what it
skipped in `completeness.notes`.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import stat
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder

CASES = Path("/work/shared/cases")
FAKE = "fake_xid_in_user_stderr"
XID149 = "xid149_nvlink_demo"

# What each case must diagnose (from its expected.json).
EXPECT = {
    FAKE: ("attributed", "application_error", "gpu-h08"),
    XID149: ("attributed", "nvlink", "node-02"),
}

GPU_FAMILY = {"gpu_hardware", "gpu_memory_ecc", "pcie", "thermal_power", "nvlink",
              "nvswitch_fabric"}

pytestmark = pytest.mark.skipif(not CASES.is_dir(), reason="example cases not available")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def copy_case(name: str, dst: Path) -> Path:
    dst = Path(dst) / name
    shutil.copytree(CASES / name, dst, symlinks=True)
    for root, dirs, files in os.walk(dst):
        os.chmod(root, 0o755)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, 0o644)
    return dst


def val(x):
    return getattr(x, "value", x)


def summary(diag) -> tuple:
    rc = diag.root_cause
    return (val(diag.outcome), rc and val(rc.category), rc and rc.node)


def gpu_summary(diag) -> tuple:
    rc = diag.root_cause
    return summary(diag) + ((rc.gpu if rc else None),)


def analyze(path: Path, timeout: float = 60, unblock=()):
    """analyze_folder in a thread: fails (after releasing any FIFO reader) if it hangs."""
    box: dict = {}

    def target():
        try:
            box["value"] = analyze_folder(path)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(timeout)
    elapsed = time.monotonic() - t0
    if t.is_alive():
        for fifo in unblock:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"analyze_folder did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    diag, bundle = box["value"]
    return diag, bundle, elapsed


def make_small_files(d: Path, fmt: str, n: int) -> None:
    for i in range(n):
        fd = os.open(d / fmt.format(i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"step %d loss 1.234 lr 3e-4\n" % i)
        finally:
            os.close(fd)


def notes_about(diag, rel: str) -> list[str]:
    return [n for n in diag.completeness.notes if rel in n]


def assert_no_gpu_blame(diag) -> None:
    for c in ([diag.root_cause] if diag.root_cause else []) + list(diag.candidates or []):
        assert val(c.category) not in GPU_FAMILY, c
        assert c.gpu is None, c


def assert_no_kernel_evidence_from(diag, bundle, rel_paths) -> None:
    rel_paths = set(rel_paths)
    for e in diag.evidence:
        if e.path in rel_paths:
            assert val(e.source) != "kernel", e
    for ln in bundle.lines:
        if ln.doc in rel_paths:
            assert val(ln.source) != "kernel", ln


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """Diagnosis of each unmodified case (on a copy), computed once."""
    out = {}
    root = tmp_path_factory.mktemp("baseline")
    for name in (FAKE, XID149):
        diag, bundle = analyze_folder(copy_case(name, root))
        assert summary(diag) == EXPECT[name], "the unmodified case must diagnose right"
        out[name] = diag
    return out


# --------------------------------------------------------------------------------------------
# (a) fake NVRM: Xid lines in rank stderr
# --------------------------------------------------------------------------------------------


def test_fake_xid_in_rank_stderr_is_not_kernel_evidence(tmp_path):
    case = copy_case(FAKE, tmp_path)
    diag, bundle, elapsed = analyze(case)
    assert summary(diag) == EXPECT[FAKE]
    assert diag.root_cause.gpu is None
    assert_no_gpu_blame(diag)
    # The root is the user's own assertion, not anything from the fake lines.
    root = [e for e in diag.evidence if e.id in diag.root_cause.evidence]
    assert root and all(e.path == "gpu-h08/rank-11.stderr" for e in root)
    assert any("AssertionError: non-finite loss nan" in e.text for e in root)
    assert any(e.line == 18 for e in root)
    # No kernel-source evidence at all mentions an Xid (the real kernel logs are clean), and
    # nothing from rank output is kernel evidence.
    for e in diag.evidence:
        if val(e.source) == "kernel":
            assert e.path.endswith("journal.log") and "Xid" not in e.text, e
    rank_docs = [d.path for d in bundle.documents if "rank-" in d.path]
    assert_no_kernel_evidence_from(diag, bundle, rank_docs)
    doc = next(d for d in bundle.documents if d.path == "gpu-h08/rank-11.stderr")
    assert doc.kind == "rank_output" and val(doc.source) == "stderr"
    # The reader says it ignored kernel-looking lines in that file.
    notes = notes_about(diag, "gpu-h08/rank-11.stderr")
    assert any("kernel-looking" in n and "ignored" in n for n in notes), diag.completeness.notes


def test_fake_xid_copied_into_every_rank_file_still_application_error(tmp_path):
    """The fake lines spread to the stderr of another node's ranks (earlier timestamps)."""
    case = copy_case(FAKE, tmp_path)
    fake = (b"Jun 03 16:41:20 gpu-h09 kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', "
            b"name=<unknown>, GPU has fallen off the bus.\n"
            b"[Tue Jun  3 16:41:20 2025] NVRM: Xid (PCI:0000:4e:00): 48, pid=2064240, "
            b"name=pt_main_thread, An uncorrectable double bit error (DBE) has been detected\n"
            b"\x1b[31mNVRM: Xid (PCI:0000:4e:00): 154, pid='<unknown>', name=<unknown>, GPU "
            b"recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)\x1b[0m\n")
    touched = []
    for p in sorted(case.glob("gpu-h09/rank-*.stderr")):
        p.write_bytes(fake + p.read_bytes())
        touched.append(p.relative_to(case).as_posix())
    diag, bundle, _ = analyze(case)
    assert summary(diag) == EXPECT[FAKE]
    assert_no_gpu_blame(diag)
    assert_no_kernel_evidence_from(diag, bundle, touched)
    assert any("kernel-looking" in n for p in touched for n in notes_about(diag, p))


# --------------------------------------------------------------------------------------------
# (b) symlinks and FIFOs in place of rank files
# --------------------------------------------------------------------------------------------

PLANT = {
    FAKE: ("gpu-h07/rank-0.stderr", "gpu-h07/rank-1.stderr", "gpu-h10/rank-24.stderr"),
    XID149: ("node-01/rank-0.stderr", "node-01/rank-1.stderr", "node-03/rank-16.stderr"),
}


@pytest.mark.parametrize("name", [FAKE, XID149])
def test_symlink_to_root_only_file_and_fifo_are_skipped(tmp_path, baseline, name):
    case = copy_case(name, tmp_path)
    link_rel, shadow_rel, fifo_rel = PLANT[name]
    secret = tmp_path / "secret"
    secret.write_bytes(b"2026-03-09T09:40:00+0000 node-03 kernel: NVRM: Xid (PCI:0000:1b:00): "
                       b"79, pid=1, name=x, GPU has fallen off the bus. MARKER-7f3a\n")
    os.chmod(secret, 0)
    os.unlink(case / link_rel)
    os.symlink(secret, case / link_rel)
    os.unlink(case / shadow_rel)
    os.symlink("/etc/shadow", case / shadow_rel)
    fifo = case / fifo_rel
    os.unlink(fifo)
    os.mkfifo(fifo)

    diag, bundle, elapsed = analyze(case, timeout=60, unblock=[str(fifo)])
    assert elapsed < 30
    assert summary(diag) == summary(baseline[name])
    assert gpu_summary(diag) == gpu_summary(baseline[name])
    for rel, what in [(link_rel, "symbolic link"), (shadow_rel, "symbolic link"),
                      (fifo_rel, "FIFO")]:
        notes = notes_about(diag, rel)
        assert any(what in n for n in notes), (rel, diag.completeness.notes)
        assert rel not in {d.path for d in bundle.documents}
    # Nothing of the link target was read.
    assert not any("MARKER-7f3a" in ln.text for ln in bundle.lines)
    assert not any("MARKER-7f3a" in e.text for e in diag.evidence)
    # The FIFO is still a FIFO and nobody is waiting on it.
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_symlinked_directories_and_node_folders_not_followed(tmp_path, baseline):
    case = copy_case(XID149, tmp_path)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "journal.log").write_bytes(
        b"2026-03-09T09:40:00+0000 node-05 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1, "
        b"name=x, GPU has fallen off the bus.\n")
    os.symlink(evil, case / "node-05")                 # a fake node folder
    os.symlink(evil, case / "node-04" / "more-logs")   # a linked sub-folder
    os.symlink("/etc", case / "node-03" / "etc")
    diag, bundle, elapsed = analyze(case)
    assert gpu_summary(diag) == gpu_summary(baseline[XID149])
    assert "node-05" not in bundle.node_dirs
    assert not any(d.path.startswith(("node-05/", "node-04/more-logs/", "node-03/etc/"))
                   for d in bundle.documents)
    for rel in ("node-05", "node-04/more-logs", "node-03/etc"):
        assert any("symbolic link" in n for n in notes_about(diag, rel)), rel


def test_fifo_as_kernel_log_and_job_record_does_not_hang(tmp_path):
    case = copy_case(XID149, tmp_path)
    fifos = []
    for rel in ("slurm/job.txt", "node-01/journal.log", "logs/slurm-4417902.out"):
        os.unlink(case / rel)
        os.mkfifo(case / rel)
        fifos.append(str(case / rel))
    diag, bundle, elapsed = analyze(case, timeout=60, unblock=fifos)
    assert elapsed < 30
    for rel in ("slurm/job.txt", "node-01/journal.log", "logs/slurm-4417902.out"):
        assert any("FIFO" in n for n in notes_about(diag, rel)), rel
    # node-02's kernel log is intact: still the NVLink fault there.
    assert summary(diag)[1:] == ("nvlink", "node-02")


# --------------------------------------------------------------------------------------------
# (c) a 1 GiB single line
# --------------------------------------------------------------------------------------------

HUGE = {FAKE: "gpu-h09/rank-16.stderr", XID149: "node-04/rank-24.stderr"}


@pytest.mark.parametrize("name", [FAKE, XID149])
def test_one_gib_single_line_rank_file(tmp_path, baseline, name):
    case = copy_case(name, tmp_path)
    rel = HUGE[name]
    p = case / rel
    with open(p, "wb") as f:          # sparse: 1 GiB of NUL bytes, no newline at all
        f.truncate(1 << 30)
    tracemalloc.start()
    try:
        diag, bundle, elapsed = analyze(case, timeout=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 60
    assert peak < 200 << 20, f"peak {peak >> 20} MiB"
    assert gpu_summary(diag) == gpu_summary(baseline[name])
    doc = next(d for d in bundle.documents if d.path == rel)
    assert doc.size == 1 << 30 and doc.truncated_bytes > 0
    assert any("not read" in n for n in notes_about(diag, rel)), diag.completeness.notes


# --------------------------------------------------------------------------------------------
# (d) binary junk, invalid UTF-8, ANSI escapes
# --------------------------------------------------------------------------------------------

ANSI = [b"\x1b[31m", b"\x1b[0m", b"\x1b[2K", b"\x1b]0;title\x07", b"\x1b[?25l", b"\x1b[1;32m",
        b"\x1bc", b"\x9b31m"]
BAD_UTF8 = [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc3",
            b"\xe2\x82", b"\x00", b"\x00\x00\x00\x00"]


def junk(n: int, seed: int, newlines: bool = True) -> bytes:
    """Non-letter junk (so it cannot form a rule literal by chance) with ANSI and bad UTF-8."""
    rnd = random.Random(seed)
    alphabet = bytes(b for b in range(256) if not (65 <= b <= 90 or 97 <= b <= 122)
                     and (newlines or b != 10))
    out = bytearray()
    while len(out) < n:
        r = rnd.random()
        if r < 0.05:
            out += rnd.choice(ANSI)
        elif r < 0.10:
            out += rnd.choice(BAD_UTF8)
        else:
            out += bytes(rnd.choice(alphabet) for _ in range(rnd.randint(1, 64)))
    return bytes(out)


def test_binary_junk_invalid_utf8_and_ansi_in_rank_files(tmp_path, baseline):
    case = copy_case(FAKE, tmp_path)
    root_rel = "gpu-h08/rank-11.stderr"
    p = case / root_rel
    prefix = junk(200_000, 1) + b"\n"
    body = p.read_bytes()
    # ANSI-wrap the real error line as a coloured logger would.
    body = body.replace(b"AssertionError: non-finite loss nan at step 15240",
                        b"\x1b[1;31mAssertionError: non-finite loss nan at step 15240\x1b[0m")
    p.write_bytes(prefix + body + junk(100_000, 2))
    # A rank file that is nothing but junk, one with NULs only, one with a CR storm.
    (case / "gpu-h09" / "rank-17.stderr").write_bytes(junk(500_000, 3))
    (case / "gpu-h09" / "rank-18.stderr").write_bytes(b"\x00" * 300_000)
    (case / "gpu-h10" / "rank-25.stderr").write_bytes(
        b"\r".join(b"\x1b[2K %d%%|" % i + b"\xe2\x96\x88" * (i // 5) for i in range(100)) * 50)
    # Junk under names that go through content sniffing.
    (case / "gpu-h10" / "messages").write_bytes(junk(100_000, 4))
    (case / "gpu-h10" / "nvidia-smi.txt").write_bytes(junk(50_000, 5))
    (case / "logs" / "torchrun.log").write_bytes(junk(50_000, 6, newlines=False))

    diag, bundle, elapsed = analyze(case)
    assert summary(diag) == EXPECT[FAKE]
    assert_no_gpu_blame(diag)
    root = [e for e in diag.evidence if e.id in diag.root_cause.evidence]
    assert any(e.path == root_rel for e in root)
    assert any("AssertionError: non-finite loss nan" in e.text and "\x1b" not in e.text
               for e in root)
    # The line number still counts LF-terminated lines, junk included.
    expected_line = prefix.count(b"\n") + body.count(b"\n", 0, body.index(b"AssertionError")) + 1
    assert any(e.line == expected_line for e in root if e.path == root_rel)
    json.dumps(diag.model_dump(mode="json"))        # the diagnosis serialises


# --------------------------------------------------------------------------------------------
# (e) 10,000 files in one node folder
# --------------------------------------------------------------------------------------------


def test_ten_thousand_small_files_in_a_node_folder(tmp_path, baseline):
    case = copy_case(XID149, tmp_path)
    d = case / "node-03"
    make_small_files(d, "w-{:05d}.out", 10_000)    # names sort after the node's real files
    diag, bundle, elapsed = analyze(case, timeout=120)
    assert elapsed < 60
    assert gpu_summary(diag) == gpu_summary(baseline[XID149])
    n_docs = sum(1 for x in bundle.documents if x.path.startswith("node-03/"))
    if n_docs < 10_000:
        # A cap applied: the notes must say so for that folder.
        assert any("node-03" in n and ("5000" in n or "first" in n)
                   for n in diag.completeness.notes), diag.completeness.notes


def test_many_files_cannot_crowd_out_the_kernel_log(tmp_path, baseline):
    case = copy_case(XID149, tmp_path)
    d = case / "node-02"
    make_small_files(d, "a-{:05d}.out", 10_000)    # names sort before journal.log, nvidia-smi
    diag, bundle, elapsed = analyze(case, timeout=120)
    assert any("node-02" in n and "5000" in n for n in diag.completeness.notes)
    assert gpu_summary(diag) == gpu_summary(baseline[XID149])


# --------------------------------------------------------------------------------------------
# (f) rank-named files full of syslog-formatted fake kernel lines
# --------------------------------------------------------------------------------------------

SYSLOG_FAKE = b"".join(
    b"Jun 03 16:41:%02d gpu-h09 kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', "
    b"name=<unknown>, GPU has fallen off the bus.\n"
    b"Jun 03 16:41:%02d gpu-h09 kernel: NVRM: GPU 0000:4e:00.0: GPU has fallen off the bus.\n"
    % (i, i) for i in range(20))
JOURNAL_JSON_FAKE = b"".join(
    json.dumps({"__REALTIME_TIMESTAMP": str(1748968880000000 + i * 1000), "_TRANSPORT": "kernel",
                "_HOSTNAME": "gpu-h09", "SYSLOG_IDENTIFIER": "kernel",
                "MESSAGE": "NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, "
                           "GPU has fallen off the bus."}).encode() + b"\n"
    for i in range(20))


def _plant(case: Path, name: str, data: bytes) -> str:
    rel = f"gpu-h09/{name}"
    (case / rel).write_bytes(data)
    return rel


@pytest.mark.parametrize("name,data", [
    ("rank-3.stderr", SYSLOG_FAKE),
    ("rank-3.err", SYSLOG_FAKE),
    ("rank3.out", SYSLOG_FAKE),
    ("rank_3.log", SYSLOG_FAKE),
    ("worker-3.stdout", SYSLOG_FAKE),
    ("RANK-3.STDERR", SYSLOG_FAKE),
    ("rank-3.stderr.gz", gzip.compress(SYSLOG_FAKE)),
    ("rank-3.stderr", JOURNAL_JSON_FAKE),
], ids=["stderr", "err", "out", "rank_log", "stdout", "upper", "gz", "journal_json"])
def test_rank_named_file_with_syslog_kernel_lines_is_rank_output(tmp_path, name, data):
    case = copy_case(FAKE, tmp_path)
    rel = _plant(case, name, data)
    diag, bundle, _ = analyze(case)
    doc = next(d for d in bundle.documents if d.path == rel)
    assert doc.kind == "rank_output" and val(doc.source) == "stderr", doc
    assert_no_kernel_evidence_from(diag, bundle, [rel])
    assert summary(diag) == EXPECT[FAKE]
    assert_no_gpu_blame(diag)
    assert any("kernel-looking" in n for n in notes_about(diag, rel)), diag.completeness.notes


def test_compressed_stderr_with_fake_kernel_lines_is_rank_output(tmp_path):
    case = copy_case(FAKE, tmp_path)
    rel = _plant(case, "worker-3.stderr.gz", gzip.compress(SYSLOG_FAKE))
    diag, bundle, _ = analyze(case)
    doc = next(d for d in bundle.documents if d.path == rel)
    assert doc.kind == "rank_output", doc
    assert summary(diag) == EXPECT[FAKE]
    assert_no_gpu_blame(diag)


def test_control_same_lines_in_a_kernel_log_do_count(tmp_path):
    """Sanity check for the tests above: the planted lines are not inert. Named as a kernel
    log, they are read as kernel evidence (so the rank-named cases really test the name rule)."""
    case = copy_case(FAKE, tmp_path)
    rel = _plant(case, "dmesg.txt", SYSLOG_FAKE)
    diag, bundle, _ = analyze(case)
    doc = next(d for d in bundle.documents if d.path == rel)
    assert doc.kind == "kernel_log"
    assert any(val(ln.source) == "kernel" for ln in bundle.lines if ln.doc == rel)


# --------------------------------------------------------------------------------------------
# pure-Python prefilter (no hyperscan) on a whole folder
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [FAKE, XID149])
def test_python_fallback_same_diagnosis(tmp_path, baseline, monkeypatch, name):
    case = copy_case(name, tmp_path)
    monkeypatch.setitem(sys.modules, "hyperscan", None)
    diag, bundle, _ = analyze(case)
    assert gpu_summary(diag) == gpu_summary(baseline[name])
    assert [(e.path, e.line, e.rule) for e in diag.evidence] == [
        (e.path, e.line, e.rule) for e in baseline[name].evidence]


def test_python_fallback_rank_file_without_trailing_newline(tmp_path, monkeypatch):
    case = copy_case(FAKE, tmp_path)
    p = case / "gpu-h08" / "rank-11.stderr"
    p.write_bytes(p.read_bytes().rstrip(b"\n"))       # ends on the AssertionError line
    monkeypatch.setitem(sys.modules, "hyperscan", None)
    diag, bundle, _ = analyze(case)
    assert summary(diag) == EXPECT[FAKE]


def test_analyze_opens_no_fifo(tmp_path, baseline):
    """`sattrib analyze` of a folder with FIFOs as rank output and as a node's kernel log:
    nothing opens them (a writer blocked on each stays blocked), the diagnosis is the
    baseline's."""
    import subprocess
    case = copy_case(XID149, tmp_path)
    fifos = [case / "logs" / "slurm-pipe.out", case / "node-03" / "dmesg.txt"]
    writers = []
    try:
        for fifo in fifos:
            os.mkfifo(fifo)
            writers.append(subprocess.Popen(["sh", "-c", 'exec 3>"$1"; echo opened', "sh",
                                             str(fifo)], stdout=subprocess.PIPE))
        diag, _, _ = analyze(case, timeout=60, unblock=[str(f) for f in fifos])
        time.sleep(0.3)
        assert [w.poll() for w in writers] == [None, None], "a FIFO was opened"
        assert summary(diag) == summary(baseline[XID149])
    finally:
        for w in writers:
            w.kill()
            w.wait()

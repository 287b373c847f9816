"""Root never opens a path a job's user chose, and the node snapshot holds only the job's window:
end-to-end on the real single-host Slurm cluster, with the installed hooks (test_hooks.py's
install, cluster, journals and job user).

What root opened is watched from outside: an inotify IN_OPEN watch on each planted file (an
O_PATH look at a name is no open and raises no event; an open for reading does), and a writer
blocked on each planted FIFO, which goes on only when someone opens the FIFO for reading.

Run (as root, ~3 min)::

    .venv/bin/python -m pytest tests/integration/test_root_paths.py -s -m slurm
"""
from __future__ import annotations

import ctypes
import gzip
import json
import os
import pwd
import shlex
import shutil
import struct
import subprocess
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from test_hooks import (TEST_USER, _bounded, cluster, db_rows, epilog_env, install,  # noqa: F401
                        job_user, nodes, timeout, wait_diagnosis, work)


class OpenWatch:
    """IN_OPEN events on the given paths (inotify): which of them something opened."""
    IN_OPEN, IN_NONBLOCK = 0x20, 0o4000

    def __init__(self, paths):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.paths = {}
        for p in paths:
            wd = self.libc.inotify_add_watch(self.fd, str(p).encode(), self.IN_OPEN)
            assert wd >= 0, (p, os.strerror(ctypes.get_errno()))
            self.paths[wd] = str(p)

    def opened(self) -> set:
        seen, data = set(), b""
        while True:
            try:
                data += os.read(self.fd, 65536)
            except BlockingIOError:
                break
        pos = 0
        while pos + 16 <= len(data):
            wd, mask, _cookie, size = struct.unpack_from("iIII", data, pos)
            if mask & self.IN_OPEN:
                seen.add(self.paths.get(wd, f"wd {wd}"))
            pos += 16 + size
        return seen

    def close(self) -> None:
        os.close(self.fd)


def writer_on(fifo: Path) -> subprocess.Popen:
    """A process blocked opening `fifo` for writing until someone opens it for reading."""
    return subprocess.Popen(["sh", "-c", 'exec 3>"$1"; echo opened', "sh", str(fifo)],
                            stdout=subprocess.PIPE, text=True)


def submit_as_user(cluster, script: str, udir: Path, *args: str) -> int:
    r = subprocess.run(["runuser", "-u", TEST_USER, "--", "sbatch", "--parsable", "--nodes=2",
                        "--ntasks-per-node=1", f"--chdir={udir}", *args],
                       input=script, env=cluster.env, capture_output=True, text=True,
                       timeout=60, cwd=str(udir))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def user_dir(prefix: str, pw) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def swap_script(work: Path, udir: Path, swaps: dict) -> str:
    """A failing 2-node job that, at its end, replaces each folder `name` of `udir` (where its
    output went) by a symbolic link to `swaps[name]`."""
    lines = [f"mv {n} {n}.old && ln -s {shlex.quote(str(t))} {n}" for n, t in swaps.items()]
    return textwrap.dedent(f"""\
        #!/bin/sh
        srun sh -c 'echo "[rank$SLURM_PROCID]: RuntimeError: the run failed" >&2; exit 1'
        cd {shlex.quote(str(udir))}
        """) + "\n".join(lines) + (
        f"\ndate +%s.%N > {shlex.quote(str(work))}/end.$SLURM_JOB_ID\nexit 1\n")


def run_swapped(cluster, install, work, udir: Path, pw, swaps: dict, output: str, error: str,
                watched: list):
    """Submit, as the job's user, the job of swap_script with its output in folders of `udir`
    named after `swaps`; wait for its diagnosis. Returns (job id, diagnosis, the `watched`
    paths something opened meanwhile)."""
    for sub in swaps:
        (udir / sub).mkdir()
        os.chown(udir / sub, pw.pw_uid, pw.pw_gid)
    watch = OpenWatch(watched)
    try:
        jid = submit_as_user(cluster, swap_script(work, udir, swaps), udir,
                             f"--output={udir}/{output}", f"--error={udir}/{error}")
        cluster.wait_job(jid, {"FAILED"}, timeout=60)
        diag, _ = wait_diagnosis(cluster, install, jid)
        time.sleep(0.5)
        return jid, diag, watch.opened()
    finally:
        watch.close()


def everything_written(install) -> bytes:
    """The bytes of every file sattrib wrote: bundles, database, spool, logs."""
    out = []
    for dirpath, _, files in os.walk(install.prefix / "var"):
        for f in files:
            p = Path(dirpath) / f
            if p.is_file() and not p.is_symlink():
                out.append(p.read_bytes())
    return b"\n".join(out)


# ---------------------------------------------------------------------------
# 1. a folder swapped for a link to /dev, and root-owned FIFOs
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(180)
def test_folder_swapped_for_dev_or_root_fifos_is_never_opened(cluster, install, nodes, work,
                                                              job_user):
    """`-o DIR/d/tty%n -e DIR/p/pipe%n`; at its end the job makes `d` a link to /dev and `p`
    a link to a root-owned folder of root-owned FIFOs. The node Epilogs (per-node output) and
    the worker (SlurmUser=root here) look at /dev/tty0, /dev/tty1 and the FIFOs but open none
    of them: no IN_OPEN on the ttys, every FIFO writer still blocked."""
    nodes.write_journals()
    udir = user_dir("sattrib-rootpaths-dev-", job_user)
    fifo_dir = Path(tempfile.mkdtemp(prefix="sattrib-rootpaths-fifo-", dir="/tmp"))
    fifo_dir.chmod(0o755)
    writers = []
    try:
        fifos = [fifo_dir / "pipe0", fifo_dir / "pipe1"]
        for f in fifos:
            os.mkfifo(f, 0o600)
            writers.append(writer_on(f))
        ttys = [t for t in (Path("/dev/tty0"), Path("/dev/tty1")) if t.exists()]
        jid, diag, opened = run_swapped(cluster, install, work, udir, job_user,
                                        {"d": "/dev", "p": fifo_dir}, "d/tty%n", "p/pipe%n",
                                        ttys)
        released = [str(f) for f, w in zip(fifos, writers) if w.poll() is not None]
        notes = diag["completeness"]["notes"]
        print(f"\njob {jid}: notes\n  " + "\n  ".join(notes))
        assert not opened, f"root opened {sorted(opened)}"
        assert not released, f"root opened the FIFOs {released}"
        for what, path in (("device", f"{udir}/d/tty0"), ("FIFO", f"{udir}/p/pipe0")):
            assert any(n.startswith(path) and what in n for n in notes), (path, notes)
        bundle = Path(db_rows(install, jid)[0]["bundle"])
        run = json.loads((bundle / "slurm" / "sattrib-run.json").read_text())
        assert run["outputs"] == [], run["outputs"]
    finally:
        for w in writers:
            w.kill()
            w.wait()
        shutil.rmtree(udir, ignore_errors=True)
        shutil.rmtree(fifo_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# 2. a root-only folder holding the user's own files, and another user's files
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(180)
def test_files_the_user_cannot_reach_or_does_not_own_are_not_read(cluster, install, nodes,
                                                                 work, job_user):
    """`-o DIR/s/out%n -e DIR/o/err%n`; at its end `s` links to a root-only (0700) folder
    holding files the job's user owns, `o` to a folder of another user's files. Read as the
    job's user, the first are out of reach (root could read them: the owner check alone let
    them through) and the second are refused by owner without being opened."""
    nodes.write_journals()
    marker = f"ROOT-ONLY-{uuid.uuid4().hex}"
    other_marker = f"OTHER-USER-{uuid.uuid4().hex}"
    other = pwd.getpwnam("nobody")
    udir = user_dir("sattrib-rootpaths-own-", job_user)
    secret_dir = Path(tempfile.mkdtemp(prefix="sattrib-rootpaths-secret-", dir="/tmp"))
    other_dir = user_dir("sattrib-rootpaths-other-", other)
    try:
        secret_dir.chmod(0o700)
        planted = []
        for i in (0, 1):
            p = secret_dir / f"out{i}"
            p.write_text(f"{marker}\nRuntimeError: {marker}\n")
            os.chown(p, job_user.pw_uid, job_user.pw_gid)
            q = other_dir / f"err{i}"
            q.write_text(f"{other_marker}\nRuntimeError: {other_marker}\n")
            q.chmod(0o644)
            os.chown(q, other.pw_uid, other.pw_gid)
            planted += [p, q]
        jid, diag, opened = run_swapped(cluster, install, work, udir, job_user,
                                        {"s": secret_dir, "o": other_dir}, "s/out%n", "o/err%n",
                                        planted)
        notes = diag["completeness"]["notes"]
        print(f"\njob {jid}: notes\n  " + "\n  ".join(notes))
        written = everything_written(install)
        assert marker.encode() not in written, "a file in a root-only folder was read as root"
        assert other_marker.encode() not in written
        others = {str(q) for q in planted if q.parent == other_dir}
        assert not opened & others, f"root opened another user's files {sorted(opened)}"
        assert any(n.startswith(f"{udir}/s/out0") and "Permission denied" in n
                   for n in notes), notes
        assert any(n.startswith(f"{udir}/o/err0") and f"owned by uid {other.pw_uid}" in n
                   for n in notes), notes
    finally:
        shutil.rmtree(udir, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)
        shutil.rmtree(other_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# 3. the node snapshot holds only the job's window; the kernel log stays the admins'
# ---------------------------------------------------------------------------

def oom_line(task: str, uid: int) -> str:
    return (f"Out of memory: Killed process 48213 ({task}) total-vm:81234567kB, "
            f"anon-rss:7654321kB, file-rss:0kB, shmem-rss:0kB, UID:{uid} pgtables:15360kB "
            "oom_score_adj:0")


def as_user(pw, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                           "--init-groups", *map(str, argv)],
                          capture_output=True, text=True, timeout=60, cwd="/")


@pytest.mark.slurm
@timeout(180)
def test_snapshot_holds_the_jobs_window_only(cluster, install, nodes, work, job_user):
    """Slurm 22.05 gives the node Epilog no start time: the job's start comes from slurmd's
    spool on the node, so another user's OOM kill three hours before the job, in the same
    kernel journal, reaches neither the snapshot nor the bundle; a kernel line during the job
    does. The job's user reads their bundle but not the nodes' kernel logs in it."""
    old_task = f"other-users-secret-{uuid.uuid4().hex[:8]}"
    now = time.time()
    nodes.write_journals({"node01": [(now - 3 * 3600, oom_line(old_task, 4243))]})
    udir = user_dir("sattrib-rootpaths-window-", job_user)
    try:
        w = shlex.quote(str(work))
        jid = submit_as_user(cluster, textwrap.dedent(f"""\
            #!/bin/sh
            srun sh -c 'echo "RuntimeError: the run failed" >&2; exit 1'
            date +%s.%N > {w}/end.$SLURM_JOB_ID
            exit 1
            """), udir, f"--output={udir}/slurm-%j.out")
        cluster.wait_job(jid, {"FAILED"}, timeout=60)
        diag, _ = wait_diagnosis(cluster, install, jid)
        bundle = Path(db_rows(install, jid)[0]["bundle"])
        journal = (bundle / "node01" / "journal.jsonl").read_text()
        notes = diag["completeness"]["notes"]
        assert "hrtimer: interrupt took" in journal        # the job's window is there ...
        assert old_task not in journal                     # ... and nothing before it
        assert old_task.encode() not in everything_written(install)
        assert not any("start time is not known" in n for n in notes), notes
        r = as_user(job_user, "cat", bundle / "node01" / "journal.jsonl")
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout[:200]
        r = as_user(job_user, "cat", bundle / "diagnosis.json")
        assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == str(jid), r.stderr
    finally:
        shutil.rmtree(udir, ignore_errors=True)


@pytest.mark.slurm
@timeout(120)
def test_snapshot_without_a_start_time_holds_the_last_hour(cluster, install, nodes):
    """A job slurmd's spool does not know (the Epilog run by hand for a made-up job): the
    last hour of kernel log at most, and the snapshot says so."""
    now = time.time()
    nodes.write_journals({"node01": [(now - 2 * 3600, oom_line("two-hours-ago", 4243)),
                                     (now - 1800, oom_line("half-an-hour-ago", 4243))]})
    jid = "990301"
    r = subprocess.run([str(install.epilog)], env=epilog_env(cluster, nodes, "node01", jid, True),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60, cwd="/")
    assert r.returncode == 0, r
    snap = install.spool_dir / cluster.cluster_name / f"{jid}.0" / "node01.snap.gz"
    try:
        data = json.loads(gzip.decompress(snap.read_bytes()))
    finally:
        shutil.rmtree(snap.parent, ignore_errors=True)
    journal = data["files"]["journal.jsonl"]
    assert "half-an-hour-ago" in journal and "two-hours-ago" not in journal
    assert any("start time is not known here: kernel log of the last 60 min" in n
               for n in data["notes"]), data["notes"]


# ---------------------------------------------------------------------------
# 4. the Epilog run twice for one job run
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(180)
def test_epilog_run_twice_takes_one_snapshot(cluster, install, nodes, work):
    """Slurm before 26.05 may run a job's Epilog more than once. Run again after the run was
    collected, and twice at once for a run not yet collected: one snapshot each time, no
    folder left in the spool after the controller removed it."""
    nodes.write_journals()
    jid = cluster.sbatch(f"srun sh -c 'echo \"RuntimeError: boom\" >&2; exit 3'\n"
                         f"date +%s.%N > {shlex.quote(str(work))}/end.$SLURM_JOB_ID\nexit 3\n",
                         nodes=2, ntasks_per_node=1)
    cluster.wait_job(jid, {"FAILED"}, timeout=60)
    wait_diagnosis(cluster, install, jid)
    spool = install.spool_dir / cluster.cluster_name
    gone = time.monotonic() + 30            # the worker removes the run after it stores it
    while (spool / f"{jid}.0").exists() and time.monotonic() < gone:
        time.sleep(0.2)
    assert not (spool / f"{jid}.0").exists()

    def epilogs(job: str, n: int) -> None:
        env = epilog_env(cluster, nodes, "node01", job, True)
        procs = [subprocess.Popen([str(install.epilog)], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
                 for _ in range(n)]
        for p in procs:
            p.communicate(timeout=60)
            assert p.returncode == 0

    epilogs(str(jid), 1)            # late: the worker has collected and removed the run
    assert not (spool / f"{jid}.0").exists(), "a second Epilog run left a snapshot behind"
    fake = "990302"                 # not collected: two runs at once
    epilogs(fake, 2)
    try:
        from sattrib.collectors import spool as spool_mod
        notes: list = []
        got = spool_mod.read_snapshots(spool / f"{fake}.0", fake, 0, {0}, True,
                                       time.monotonic() + 20, notes, str(cluster.munge_socket))
        assert list(got) == ["node01"] and not notes, notes
    finally:
        shutil.rmtree(spool / f"{fake}.0", ignore_errors=True)
    log = install.log("epilog.log")
    for job in (str(jid), fake):
        lines = [ln for ln in log.splitlines() if f"job {job}.0 on node01:" in ln]
        assert sum("snapshot /" in ln for ln in lines) == 1, lines
        assert sum("taken by an earlier run" in ln for ln in lines) == 1, lines

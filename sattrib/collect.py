"""The controller side: turn one finished job run into a stored diagnosis.

Run by the EpilogSlurmctld worker (detached, as SlurmUser) and by `sattrib collect JOBID`.
Steps: decide whether the run failed (exit codes, final state, a requeue), wait with a deadline
for the node snapshots, build the job's evidence bundle (an evidence folder: slurm/, logs/, one
folder per node), analyse it and upsert the diagnosis. The bundle is kept, so a diagnosis can be
replayed with `sattrib analyze BUNDLE`, for `keep_bundles_days`. Rerunning for the same run
rebuilds the same bundle and replaces the same database row.

Nothing the worker cannot fetch loses the diagnosis: without scontrol, the facts slurmctld put in
EpilogSlurmctld's environment file it under the right job (the scheduler record is then listed
as missing); every step before the analysis shares one deadline (`worker_deadline_s`), and the
job's own files are read in a child process that is abandoned at that deadline.

Bundles hold what users and the kernel wrote (job output, kernel journals, the job's command
line): they are private whatever the umask. Directories 0750 and files 0640, owned by the
worker and the group of `bundle_dir`; the folders above them 0751, so a user can reach a path
they know but list nobody's jobs; the job's user gets read on their own bundle through a POSIX
ACL (`setfacl`), so that `sattrib JOBID` can show it without the database, except on the
nodes' kernel logs (a node's kernel log names other users' tasks and files).

The job's files are read by a child process that has given up root for the job's user
(slurm_job.copy_outputs): the kernel checks every path as it would check that user's.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .collectors import output_lines, probe, probes_file
from .errors import UserError

if TYPE_CHECKING:
    from .collectors.slurm_env import JobEnv

log = logging.getLogger("sattrib.collect")

@dataclass
class Outcome:
    diagnosed: bool
    message: str
    diagnosis: object = None
    bundle: Optional[Path] = None


def _drop_unused_snapshots(spool, st, cluster, job_id, restart, env_job) -> None:
    """A run that is not diagnosed may still have snapshots on the way (a stale derived exit
    code made the nodes take them): give them a moment to land, then remove them."""
    d = spool.job_dir(Path(st.spool_dir), cluster, job_id, restart)
    if env_job is not None and env_job.nonzero:
        time.sleep(min(st.collect_wait_s, 15))
    if d.exists():
        spool.remove_job(d)


def _failed(env_job, info: dict, restart: int, job_states: list) -> tuple[bool, str]:
    state = (info.get("JobState") or "").upper()
    restarts = int(info.get("Restarts") or 0) if str(info.get("Restarts", "")).isdigit() else 0
    if state == "COMPLETED" and env_job is not None and not env_job.exit_status \
            and not env_job.exit_code and not env_job.signal:
        # The derived exit code can be left over from an earlier run of a requeued job.
        return False, "state COMPLETED, exit 0"
    if env_job is not None and env_job.nonzero:
        return True, (f"exit {env_job.exit_code}:{env_job.signal} (derived "
                      f"{env_job.derived or '0:0'})")
    if state in {s.upper() for s in job_states}:
        return True, f"state {state}"
    if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED") and restarts > restart:
        # Requeued after this run (NODE_FAIL, preemption, requeue): its exit code said 0.
        return True, f"requeued (Restarts={restarts}, reason {info.get('Reason')})"
    return False, f"state {state or 'unknown'}, exit 0"


BUNDLE_DIR_MODE, BUNDLE_FILE_MODE, PARENT_MODE = 0o750, 0o640, 0o751


def _parent_dirs(root: Path, cluster_dir: Path) -> None:
    """`bundle_dir` and its per-cluster folder: 0751 when they are ours (traverse, not list)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    for d in (root, cluster_dir):
        try:
            os.mkdir(d, PARENT_MODE)
        except FileExistsError:
            pass
        st = os.stat(d)
        if st.st_uid == os.geteuid() and st.st_mode & 0o7777 != PARENT_MODE:
            os.chmod(d, PARENT_MODE)


def _seal(top: Path, gid: int) -> None:
    """Every directory 0750 and file 0640 under `top`, in group `gid` (when we may set it)."""
    for d, dirs, files in os.walk(top):
        for p, mode in [(d, BUNDLE_DIR_MODE)] + [(os.path.join(d, f), BUNDLE_FILE_MODE)
                                                 for f in files]:
            if os.path.islink(p):
                continue
            os.chmod(p, mode)
            if gid != os.getegid():
                try:
                    os.chown(p, -1, gid)
                except PermissionError:
                    pass                      # not root and not in that group: keep ours


def _write_private(path: Path, text: str, gid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                 BUNDLE_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, BUNDLE_FILE_MODE)
        if gid != os.getegid():
            try:
                os.fchown(fd, -1, gid)
            except PermissionError:
                pass
        f.write(text)


def _grant_read(bundle: Path, uid: Optional[int], timeout: float,
                private: frozenset = frozenset()) -> Optional[str]:
    """Let the job's user read their own bundle (and what is written into it later): a POSIX
    ACL entry plus a default entry on its directories, on every file but those in `private`
    (the nodes' kernel logs: even in the job's window, a shared node's kernel log names other
    users' tasks and files, in OOM kills and segfaults; the diagnosis says what it found
    there). None when done or not needed, else the note that says why the bundle stays
    private."""
    if uid is None or uid == 0 or uid == os.geteuid():
        return None
    dirs, files = [], []
    for d, _, names in os.walk(bundle):
        dirs.append(d)
        files += [p for p in (os.path.join(d, n) for n in sorted(names)) if p not in private]
    for acl, paths in ((f"u:{uid}:rX,d:u:{uid}:rX", dirs), (f"u:{uid}:r", files)):
        for i in range(0, len(paths), 1000):
            r = probe.run("setfacl", ["setfacl", "-P", "-m", acl, "--", *paths[i:i + 1000]],
                          time.monotonic() + timeout, max_bytes=1 << 16)
            if not r.ok:
                why = ("setfacl is not installed (Debian package acl)"
                       if r.reason == "not installed" else
                       (r.err.decode("utf-8", "replace").strip().splitlines() or [r.reason])[-1])
                return (f"the job's user (uid {uid}) cannot read this bundle: {why}; it stays "
                        "readable by SlurmUser and its group only")
    return None


def _lock(path: Path, timeout: float):
    _parent_dirs(path.parent.parent.parent, path.parent.parent)
    try:
        os.mkdir(path.parent, BUNDLE_DIR_MODE)    # lock names are job ids: not for listing
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    t_end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > t_end:
                os.close(fd)
                return None
            time.sleep(0.2)


def collect_job(job_id: str, settings, env_job=None, restart: Optional[int] = None,
                force: bool = False, wait_snapshots: Optional[float] = None,
                notes: Optional[list] = None, ended: Optional[float] = None) -> Outcome:
    """`notes`: what the caller already knows the diagnosis should say (a config problem).
    `ended`: when the job ended (when it was queued): the snapshot wait then runs from that
    time, so a job that waited in the queue does not wait again; by hand it starts now."""
    from .collectors import slurm_job, spool
    from .engine.hostlist import expand

    st = settings
    t0 = time.monotonic()
    queued_at, ended = ended, ended or time.time()
    hard = t0 + st.worker_deadline_s          # every collection step ends by then
    wait = st.collect_wait_s if wait_snapshots is None else wait_snapshots
    deadline = min(t0 + wait + 60, hard)
    notes = list(notes or [])
    _warn_network_db(st.database)
    cluster = env_job.cluster if env_job and env_job.cluster else None
    if cluster is None:
        # `sattrib collect` by hand: file the run under the name the hooks use.
        cluster = slurm_job.cluster_name(min(deadline, t0 + 10)) or st.cluster

    first, err = slurm_job.scontrol_job(job_id, min(deadline, t0 + 10))
    text = ""
    if first:
        text, err = slurm_job.wait_final(job_id, min(deadline, t0 + 30))
    # else slurmctld did not answer (or does not know the job): no more scontrol calls, each
    # would wait as long (scontrol retries a missing slurm.conf for 60 s).
    if not text:
        text = slurm_job.pyslurm_job(job_id) or ""
    info = slurm_job.kv(text, job_id) if text else {}
    if not info and env_job is None:
        if _UNREACHABLE.search(err or ""):
            raise UserError(f"cannot reach slurmctld ({err.strip()})",
                            "check that slurmctld is up and that SLURM_CONF points at this "
                            "cluster's slurm.conf (scontrol ping)")
        raise UserError(f"slurmctld does not know job {job_id} ({err or 'no output'})",
                        "run it within MinJobAge of the job's end, or analyse an evidence "
                        "folder with `sattrib analyze DIR`")
    if not info:
        notes.append(f"scontrol show job {job_id} failed ({err or 'no output'}): the "
                     "scheduler's record is missing; the job's facts are those slurmctld "
                     "passed to EpilogSlurmctld")
    # Whose job it is, its name, partition, nodes and output paths exactly as slurmctld gives
    # them (EpilogSlurmctld's environment; by hand, squeue's fields): scontrol's text, which
    # holds what the job's user wrote, completes them and never overrides them.
    exact = (slurm_job.env_info(env_job) if env_job is not None
             else slurm_job.squeue_facts(job_id, min(deadline, time.monotonic() + 10)))
    info = slurm_job.job_facts(info, exact, notes)
    if restart is None:
        restart = env_job.restart if env_job else int(info.get("Restarts") or 0)
        if env_job is None and (info.get("JobState") in ("PENDING", "REQUEUED")) and restart:
            restart -= 1                     # the run that ended is the one before this one
    failed, why = _failed(env_job, info, restart, st.job_states)
    if not failed and not force:
        _drop_unused_snapshots(spool, st, cluster, job_id, restart, env_job)
        return Outcome(False, f"job {job_id}.{restart}: not diagnosed ({why})")
    # The run's own start and end: once a requeued job is PENDING again, scontrol shows the
    # next run's times; the first reading (COMPLETING) still had this run's start.
    from .collectors.slurm_state import parse_time
    first_kv = slurm_job.job_facts(slurm_job.kv(first, job_id), exact, []) if first else {}
    run = {"start_time": (env_job.start if env_job else None)
           or parse_time(first_kv.get("StartTime")),
           "end_time": (env_job.end if env_job else None) or parse_time(info.get("EndTime"))
           or parse_time(first_kv.get("EndTime"))
           or (round(ended) if env_job is not None else None)}

    lock = _lock(Path(st.bundle_dir) / cluster / ".locks" / f"{job_id}.{restart}",
                 max(min(120, hard - time.monotonic()), 1))
    if lock is None:
        return Outcome(False, f"job {job_id}.{restart}: another worker holds its lock")
    try:
        out = _collect_locked(_Run(
            job_id, restart, cluster, env_job, text, info, why, run, notes,
            _Budget(t0, wait, deadline, hard,
                    max(0.0, time.time() - queued_at) if queued_at else 0.0)), st)
    finally:
        os.close(lock)
    if out.bundle is not None:
        prune_bundles(Path(st.bundle_dir), st.keep_bundles_days, keep=out.bundle)
    return out


@dataclass
class _Budget:
    """The time a collection has: all on the monotonic clock but `wait` and `waited`."""
    t0: float             # when the worker took the job
    wait: float           # how long node snapshots are waited for, from the job's end
    deadline: float       # the collection steps' deadline
    hard: float           # the worker's: every step ends by then
    waited: float = 0.0   # already spent in the queue since the job ended


@dataclass
class _Run:
    """One run to collect under its lock: who it is, what slurmctld said of it, and why it is
    diagnosed."""
    job_id: str
    restart: int
    cluster: str
    env_job: Optional[JobEnv]   # EpilogSlurmctld's facts of the job (None by hand)
    text: str             # `scontrol show job` text ("" when slurmctld did not answer)
    info: dict            # the job's facts (slurm_job.job_facts)
    why: str              # why the run is diagnosed
    times: dict           # the run's own start and end (slurm/sattrib-run.json)
    notes: list           # what the diagnosis should say about the collection
    budget: _Budget


def _collect_locked(r: _Run, st) -> Outcome:
    from .collectors import slurm_job, spool
    from .engine.hostlist import compress, expand
    job_id, restart, cluster, env_job, notes = r.job_id, r.restart, r.cluster, r.env_job, r.notes
    t0, wait, deadline, hard = r.budget.t0, r.budget.wait, r.budget.deadline, r.budget.hard
    info = r.info
    nodes = (env_job.nodes if env_job and env_job.nodes else expand(info.get("NodeList", "")))
    spool_dir = spool.job_dir(Path(st.spool_dir), cluster, job_id, restart)
    bundle_dir = Path(st.bundle_dir) / cluster / f"{job_id}.{restart}"
    for stale in bundle_dir.parent.glob(f".{bundle_dir.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)       # left by a worker that was killed
    if not spool_dir.exists() and (bundle_dir / "diagnosis.json").is_file():
        # A rerun after the run was fully collected (its snapshots are gone from the spool):
        # replay the kept bundle rather than rebuild it with less evidence.
        d = _analyze_and_store(bundle_dir, cluster, st, notes)
        return Outcome(True, f"job {job_id}.{restart}: replayed its evidence bundle", d,
                       bundle_dir)

    # Wait for the node snapshots; nodes Slurm already knows are down will not send one.
    nodes_text = slurm_job.scontrol_nodes(nodes, min(deadline, time.monotonic() + 10)) \
        if r.text else ""
    down = {ln.split()[0].split("=", 1)[1] for ln in nodes_text.splitlines()
            if ln.startswith("NodeName=") and any(s in ln for s in (
                "State=DOWN", "NOT_RESPONDING", "State=FAIL", "State=UNKNOWN"))}
    expect = [n for n in nodes if n not in down]
    if env_job is not None and env_job.known and not env_job.nonzero:
        # The nodes saw exit 0 too (a NODE_FAIL, a scancel): their Epilogs took the fast path
        # and will not send snapshots. Nothing to wait for.
        expect = []
        notes.append(f"{QUIET_NOTE}: the node Epilogs did not take snapshots")
    trusted = {0, st.spool_writer_uid}
    t_wait = min(time.monotonic() + wait - r.budget.waited, hard)   # `wait` from the job's end
    snaps: dict = {}
    while True:
        scratch: list[str] = []
        snaps = spool.read_snapshots(spool_dir, job_id, restart, trusted,
                                     st.spool_auth == "munge", deadline, scratch,
                                     st.munge_socket) if spool_dir.is_dir() else {}
        if all(n in snaps for n in expect) or time.monotonic() >= t_wait:
            notes += scratch
            break
        time.sleep(0.5)
    quiet = env_job is not None and env_job.known and not env_job.nonzero
    delivery = _delivery(nodes, snaps, down, quiet, wait)
    notes += [f"no snapshot from {n}" + (" (Slurm reports it down)" if n in down else
                                         f" within {wait:.0f}s")
              for n, state, _ in delivery if state == "missing"]

    bundle = _build_bundle(bundle_dir, r.text,
                           nodes_text, slurm_job.sacct(job_id, min(deadline,
                                                                   time.monotonic() + 15)),
                           snaps, info, env_job, restart, st, notes, slurm_job,
                           dict(r.times, nodes=compress(nodes), snapshots=[
                               {"node": n, "state": state, "reason": reason}
                               for n, state, reason in delivery]), hard)
    d = _analyze_and_store(bundle, cluster, st)
    spool.remove_job(spool_dir)
    root = d.root_cause
    what = (f"{root.category.value} on {root.node}" if root else d.outcome.value)
    return Outcome(True, f"job {job_id}.{restart}: {r.why}; diagnosed {what} in "
                         f"{time.monotonic() - t0:.1f}s ({len(snaps)}/{len(nodes)} node "
                         "snapshots)", d, bundle)


# The worker's note on a run the scheduler ended (its exit status 0): no snapshot was due.
QUIET_NOTE = "the job's exit status was 0 (a scheduler-ended run)"


def _delivery(nodes: list, snaps: dict, down: set, quiet: bool, wait: float) -> list:
    """(node, state, reason) of each node's Epilog snapshot, as the run's record keeps it for
    hook health: `present`, `missing` (Slurm reports the node down, or nothing came in time)
    or `not_due` (a scheduler-ended run: the Epilogs took none)."""
    return [(n, "present", None) if n in snaps else
            (n, "missing", "Slurm reports it down") if n in down else
            (n, "not_due", QUIET_NOTE) if quiet else
            (n, "missing", f"none came within {wait:.0f} s") for n in nodes]


def _analyze_and_store(bundle: Path, cluster: str, st, notes: Optional[list] = None):
    """`notes` are added to the diagnosis (a replay adds what this run knows, such as a config
    problem, to the notes kept in the bundle)."""
    from .analysis import analysis_settings, analyze_folder, load_rules, reader_limits
    from .store import open_store
    rules = load_rules(st.rules_dirs)
    d, _ = analyze_folder(bundle, settings=analysis_settings(st), rules=rules,
                          limits=reader_limits(st), timezone=st.timezone)
    for n in notes or ():
        if n not in d.completeness.notes:
            d.completeness.notes.append(n)
    tmp = bundle / ".diagnosis.json.tmp"
    # 0640 in the bundle's group; the bundle's default ACL lets the job's user read it.
    _write_private(tmp, d.model_dump_json(indent=2) + "\n", os.stat(bundle).st_gid)
    os.replace(tmp, bundle / "diagnosis.json")
    db = open_store(st.database)
    did = db.upsert(d, cluster, bundle_path=str(bundle))
    db.sync_rules(rules)
    try:
        from .incidents import act
        act(db, did, d, st, bundle)
    except Exception:                 # acting is best effort: the diagnosis is stored
        log.exception("acting on %s failed", did)
    return d


def _build_bundle(dest: Path, job_text: str, nodes_text: str, sacct_text: str, snaps: dict,
                  info: dict, env_job, restart: int, st, notes: list, slurm_job,
                  run: dict, deadline: float) -> Path:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _parent_dirs(Path(st.bundle_dir), dest.parent)
    gid = os.stat(st.bundle_dir).st_gid
    os.mkdir(tmp, 0o700)            # nobody else can enter it until it is sealed below
    (tmp / "slurm").mkdir()
    if job_text:
        name = "job.json" if job_text.lstrip().startswith("{") else "job.txt"
        (tmp / "slurm" / name).write_text(job_text)
    if nodes_text:
        (tmp / "slurm" / "nodes.txt").write_text(nodes_text)
    if sacct_text.count("\n") > 1:
        (tmp / "slurm" / "sacct.txt").write_text(sacct_text)
    record = {"job_id": info.get("JobId") or (env_job.job_id if env_job else None),
              "name": info.get("JobName"), "user": info.get("User") or None,
              "partition": info.get("Partition"), "cluster": env_job.cluster if env_job else None,
              "restart_cnt": restart, "sattrib_run": True,
              "array_job_id": (env_job.array_job if env_job else None) or info.get("ArrayJobId"),
              **{k: v for k, v in run.items() if v is not None}}
    if env_job is not None:
        record.update(exit_status=env_job.exit_status, exit_code=env_job.exit_code,
                      signal=env_job.signal, derived=env_job.derived)
    from .collectors.sources import kernel_files, source_of_probe
    kernel_logs = set()
    for node, snap in sorted(snaps.items()):
        notes.extend(f"{node}: {n}" for n in (snap.data.get("notes") or [])[:20]
                     if isinstance(n, str))
        nd = tmp / node
        nd.mkdir()
        for name, content in sorted((snap.data.get("files") or {}).items()):
            if "/" in name or name.startswith("."):
                continue
            (nd / name).write_text(content)
            if name in kernel_files():
                kernel_logs.add(str(nd / name))
        (nd / probes_file.NAME).write_text(probes_file.render(
            snap.data.get("probes") or [], snap.trusted_by, snap.data.get("taken_at"),
            run.get("end_time"), source_of_probe))
    if st.prometheus_url:              # metrics for every node, with or without a snapshot
        from .collectors import prometheus
        from .engine.hostlist import expand
        got = prometheus.fetch(st, expand(run.get("nodes") or ""), run.get("start_time"),
                               run.get("end_time"), deadline)
        prometheus.write_bundle(tmp, got)
        notes.extend(got.notes)
        log.info("metrics: %d queries in %.1fs", got.queries, got.seconds)
    # The job's own output (written by the user: read with care).
    uid = int(info["Uid"]) if info.get("Uid", "").isdigit() else (env_job.uid if env_job else None)
    job_gid = _job_gid(info, env_job)
    logs = tmp / "logs"
    logs.mkdir()
    # The copies get names of sattrib's own: what the user called a file (`%x-%j.log`,
    # `kern.log`) never decides how it is read. The manifest keeps where each came from.
    # Where the nodes scanned their own output files, their extracts replace the copies.
    from .engine.hostlist import expand
    shipped = _shipped_outputs(snaps, st, notes)
    find_until = time.monotonic() + max(deadline - time.monotonic(), 0) / 2
    sources = slurm_job.output_paths_as_user((uid, job_gid), find_until, info,
                                             st.extra_output_globs, notes,
                                             expand(run.get("nodes") or ""))
    sources += sorted(set(shipped) - set(sources))
    pairs, record["outputs"] = [], []
    for i, src in enumerate(sources):
        copy = logs / _copy_name(i, src)
        if src in shipped:
            node, text, cut_note = shipped[src]
            extract = copy.with_name(copy.name + output_lines.SUFFIX)
            extract.write_text(text)
            if cut_note:
                notes.append(cut_note)
            record["outputs"].append({"extract": f"logs/{extract.name}", "source": src,
                                      "node": node})
        else:
            pairs.append((src, copy))
    slurm_job.copy_outputs(pairs, uid, st.output_cap_mb << 20, notes, deadline, job_gid)
    record["outputs"] += [{"copy": f"logs/{d.name}", "source": src} for src, d in pairs
                          if d.is_file()]
    record["outputs"].sort(key=lambda o: o.get("copy") or o["extract"])
    (tmp / "slurm" / "sattrib-run.json").write_text(json.dumps(record, indent=1) + "\n")
    _seal(tmp, gid)
    note = _grant_read(tmp, uid, st.probe_timeout_s, frozenset(kernel_logs))
    if note:
        notes.append(note)
    if notes:
        _write_private(tmp / "slurm" / "collect-notes.txt",
                       "\n".join(dict.fromkeys(notes)) + "\n", gid)
    if dest.exists():
        old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
    return dest


def _job_gid(info: dict, env_job) -> Optional[int]:
    """The job's group, in which the worker reads the job's files as its user: the one
    slurmctld gave EpilogSlurmctld (SLURM_JOB_GID, in the worker's environment), else
    scontrol's `GroupId=name(gid)`."""
    gid = os.environ.get("SLURM_JOB_GID", "") if env_job is not None else ""
    m = re.search(r"\((\d+)\)$", info.get("GroupId") or "")
    gid = gid if gid.isdigit() else m.group(1) if m else ""
    return int(gid) if gid else None


# What scontrol prints when it cannot talk to slurmctld at all (src/api, src/common/slurm_conf.c).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Connection refused|"
                          r"Could not establish a configuration source|slurm\.conf.*(?:No such "
                          r"file|not found)|Socket timed out|Zero Bytes were transmitted|"
                          r"timed out after", re.I)


def _shipped_outputs(snaps: dict, st, notes: list) -> dict:
    """source path -> (node, extract text, cut note) from the nodes' snapshots, for the extracts
    made with this controller's rules and budget (others are copied here instead). Two nodes
    that read the same file (one shared host name) made the same extract: the first is used."""
    from .analysis import load_rules, reader_limits
    from .collectors import output_lines
    offered = [(node, o) for node, snap in sorted(snaps.items())
               for o in (snap.data.get("outputs") or []) if isinstance(o, dict)
               and isinstance(o.get("source"), str) and isinstance(o.get("lines"), str)
               and os.path.isabs(o["source"])]
    if not offered:
        return {}
    want = (load_rules(st.rules_dirs).version,
            output_lines.budget(reader_limits(st), st.output_cap_mb << 20))
    out: dict = {}
    for node, o in offered:
        try:
            head = json.loads(o["lines"].split("\n", 1)[0])
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("format") != output_lines.FORMAT:
            notes.append(f"{node}: extract of {o['source']} not readable: copied instead")
            continue
        if (head.get("rules"), head.get("budget")) != want:
            notes.append(f"{node}: extract of {o['source']} made with other rules or limits "
                         f"({head.get('rules')}): copied instead")
            continue
        cut = head.get("copy_note") if isinstance(head.get("copy_note"), str) else None
        out.setdefault(os.path.normpath(o["source"]), (node, o["lines"], cut))
    return out


def _copy_name(i: int, src: str) -> str:
    """`output-003.txt`; a rank number in the original name (`rank-%t.err`) is kept as the
    reader's rank hint: `output-003.rank-5.txt`."""
    m = re.search(r"rank[-_.]?(\d{1,6})", os.path.basename(src), re.I)
    return f"output-{i:03d}" + (f".rank-{int(m.group(1))}" if m else "") + ".txt"


PRUNE_EVERY_S = 3600


def prune_bundles(bundle_dir: Path, keep_days: int, keep: Optional[Path] = None,
                  now: Optional[float] = None) -> int:
    """Delete evidence bundles (and their lock files) not changed for `keep_days` days; at
    most once an hour (a stamp file's mtime), never `keep`; 0 days keeps everything. The
    database rows stay: a pruned diagnosis is still shown, it can no longer be replayed."""
    if keep_days <= 0 or not bundle_dir.is_dir():
        return 0
    now = time.time() if now is None else now
    stamp = bundle_dir / ".pruned"
    try:
        if now - stamp.stat().st_mtime < PRUNE_EVERY_S:
            return 0
    except FileNotFoundError:
        pass
    try:
        stamp.touch()
        os.utime(stamp, (now, now))
    except OSError:
        return 0
    cutoff = now - keep_days * 86400
    keep = keep.resolve() if keep else None
    removed = 0
    for cluster in _subdirs(bundle_dir):
        for d in _subdirs(cluster) + _subdirs(cluster / ".locks", files=True):
            try:
                old = d.lstat().st_mtime < cutoff
            except OSError:
                continue
            if not old or (keep is not None and d.resolve() == keep):
                continue
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
                removed += not d.exists()
            else:
                try:
                    d.unlink()
                except OSError:
                    pass
    if removed:
        log.info("pruned %d evidence bundles older than %d days", removed, keep_days)
    return removed


def _subdirs(d: Path, files: bool = False) -> list:
    try:
        return [Path(e.path) for e in os.scandir(d) if not e.name.startswith(".") and (
            e.is_file(follow_symlinks=False) if files else e.is_dir(follow_symlinks=False))]
    except OSError:
        return []


_warned: set = set()


def _warn_network_db(database: str) -> None:
    from .mounts import network_fs_warning
    msg = network_fs_warning(database)
    if msg and msg not in _warned:
        _warned.add(msg)
        log.warning("%s", msg)

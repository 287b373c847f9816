"""Node Epilog: for a job that did not end cleanly, snapshot node-local evidence into the spool.

Slurm drains a node whose Epilog fails or hangs, so this never raises, always exits 0 and keeps
to its budget (`epilog_budget_s`); each probe has its own deadline inside it. A job that
exited 0 returns at once (the installed wrapper does that check before Python even starts).
It never talks to slurmctld: a 1,000-node job must not send 1,000 RPCs at once (the job's
start, when Slurm does not pass it, comes from slurmd's spool on this node). A second run of
the Epilog for the same job run does nothing (spool.claim_run).
Where the job's output is per node (`%N`/`%n` in its pattern or in `extra_output_globs`), it
also scans this node's output files and ships their kept lines (collectors/node_output.py),
reading them as the job's user, never as root, and it ships the facts of the job's
flight-recorder dumps (collectors/flight_recorder.py).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Optional

log = logging.getLogger("sattrib.epilog")


def snapshot(env, deadline: float) -> str:
    from ..collectors import node_snapshot, slurm_env, spool
    from ..config import load_for_hook

    job = slurm_env.from_env(env)
    if job is None:
        return "no SLURM_JOB_ID: not running as an Epilog"
    if job.known and not job.nonzero:
        return f"job {job.job_id}: exited 0, nothing to do"
    loaded = load_for_hook(env)
    st = loaded.settings
    for p in loaded.problems:
        log.warning("config: %s", p)
    if st.probe_path:
        os.environ["PATH"] = st.probe_path + ":" + os.environ.get("PATH", os.defpath)
    node = job.node or os.uname().nodename.split(".")[0]
    cluster = job.cluster or st.cluster
    run = f"job {job.job_id}.{job.restart} on {node}"
    try:
        if not spool.claim_run(st.spool_dir, cluster, job.job_id, job.restart, node,
                               st.spool_writer_uid):
            return f"{run}: taken by an earlier run of this Epilog, nothing to do"
    except spool.SpoolError as e:
        return f"{run}: snapshot not written: {e}"
    start = job.start or slurm_env.spool_start(env, job.job_id)
    snap = node_snapshot.collect(
        job.job_id, job.restart, node, job.uid, start, deadline,
        probe_timeout=st.probe_timeout_s, journal_dir=st.journal_dir.replace("%n", node),
        journal_margin=st.journal_margin_s, journal_lookback=st.journal_lookback_s,
        ib_root=st.ib_sysfs_root,
        env_exit=f"{job.exit_status}/{job.exit_code}:{job.signal}/{job.derived}")
    snap["notes"] = [f"config: {p}" for p in loaded.problems] + snap["notes"]
    try:
        snap["outputs"] = _ship_outputs(job, st, deadline - WRITE_RESERVE_S, snap["notes"],
                                        _gid(env))
    except Exception:     # the rest of the snapshot still goes; the controller copies the files
        log.exception("output extracts failed")
        snap["outputs"] = []
        snap["notes"].append("output extracts failed on the node: the controller copies them")
    _ship_flight_recorder(job, st, deadline - WRITE_RESERVE_S, snap, _gid(env))
    try:
        path = spool.write_snapshot(st.spool_dir, cluster, job.job_id, job.restart, node, snap,
                                    deadline, munge=st.spool_auth == "munge",
                                    munge_socket=st.munge_socket,
                                    writer_uid=st.spool_writer_uid)
    except spool.SpoolError as e:     # a level of the spool is not safe for root to write in
        return f"{run}: snapshot not written: {e}"
    failed = [p["name"] for p in snap["probes"] if not p["ok"]]
    return (f"{run}: snapshot {path} "
            f"({', '.join(sorted(snap['files'])) or 'no files'}"
            f"{'; extracts of ' + str(len(snap['outputs'])) + ' output files' if snap['outputs'] else ''}"
            f"{'; failed probes: ' + ', '.join(failed) if failed else ''})")


def _gid(env) -> Optional[int]:
    """The job's group as slurmd passes it (SLURM_JOB_GID), for reading as the job's user."""
    gid = env.get("SLURM_JOB_GID", "")
    return int(gid) if gid.isdigit() else None


WRITE_RESERVE_S = 2.0      # of the budget kept for writing the snapshot and its credential


def _ship_outputs(job, st, deadline: float, notes: list, gid: Optional[int] = None) -> list:
    """The job's output files of this node (%N / %n patterns), scanned here: their kept lines
    go in the snapshot instead of the controller copying the bytes (collectors/output_lines).
    The folders are listed and the files opened as the job's user (uid, `gid`), never as
    root: a folder swapped for a link to /dev or to a root-only folder gets what the user
    would get."""
    import socket

    from ..analysis import reader_limits
    from ..collectors import node_output, slurm_job
    host = socket.gethostname().split(".")[0]

    def find(_):
        # Globbing lists directories: on a hung mount that blocks, so it runs in a child too.
        found: list = []
        return {"paths": slurm_job.node_output_paths(job, host, st.extra_output_globs, found),
                "notes": found}
    try:
        done, _ = slurm_job.in_child(1, find, min(deadline, time.monotonic()
                                                  + st.probe_timeout_s), as_user=(job.uid, gid))
    except OSError as e:
        notes.append(f"output files not looked for: {e.strerror} (the controller copies them)")
        return []
    if not done:
        notes.append("output files not looked for: their folders did not answer in "
                     f"{st.probe_timeout_s:.0f} s (the controller copies them)")
        return []
    paths = done[0]["paths"]
    notes.extend(done[0]["notes"])
    if not paths:
        return []
    if deadline - time.monotonic() < 1.0:
        notes.append(f"{len(paths)} output files left to the controller (no time left)")
        return []
    outputs, more = node_output.ship(paths, job.uid, st.output_cap_mb << 20,
                                     reader_limits(st), st.rules_dirs, deadline, gid)
    notes.extend(more)
    return outputs


def _ship_flight_recorder(job, st, deadline: float, snap: dict,
                          gid: Optional[int] = None) -> None:
    """The facts of the job's flight-recorder dumps on this node, as one file of the snapshot
    (collectors/flight_recorder.ship reads them as the job's user); never the pickles."""
    from ..collectors import flight_recorder
    if not st.flight_recorder_globs:
        return
    try:
        text = flight_recorder.ship(st.flight_recorder_globs, job, st.flight_recorder_cap_mb << 20,
                                    deadline, snap["notes"], gid)
    except Exception:     # the rest of the snapshot still goes
        log.exception("flight-recorder facts failed")
        snap["notes"].append("flight-recorder dumps not read on the node (see its epilog log)")
        return
    if text:
        snap["files"][flight_recorder.FACTS_NAME] = text


def main(env=None) -> int:
    t0 = time.monotonic()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s sattrib-epilog[%(process)d] %(message)s")
    env = os.environ if env is None else env
    try:
        from ..config import load_for_hook
        budget = load_for_hook(env).settings.epilog_budget_s
    except Exception:                # a broken config must not cost the node
        budget = 20.0
    try:
        msg = snapshot(env, t0 + budget)
        log.info("%s (%.2fs)", msg, time.monotonic() - t0)
    except Exception:                # the one place a catch-all is right: never fail the node
        log.exception("epilog snapshot failed (%.2fs)", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""EpilogSlurmctld: return at once; a detached worker diagnoses the job.

slurmctld runs this as SlurmUser, concurrently with the node Epilogs, and waits for it. So it
only forks a worker into its own session (stdio on the worker log, no inherited descriptors)
and exits 0. The worker (sattrib.collect) waits with a deadline for the node snapshots, reads
scheduler state and the job's output, and stores the diagnosis, all within worker_deadline_s
(the job's files are read in a child it abandons at the deadline).

The hooks read their settings leniently (config.load_for_hook): a typo in sattrib.toml costs
that one setting its value, never the diagnosis, and the diagnosis says so.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

from .launch import open_log

log = logging.getLogger("sattrib.epilog_slurmctld")
ALARM_GRACE_S = 120


def _worker(env: dict) -> None:
    from ..collect import collect_job
    from ..collectors import slurm_env
    from ..config import load_for_hook

    loaded = load_for_hook(env)
    for p in loaded.problems:
        log.warning("config: %s", p)
    job = slurm_env.from_env(env)
    if job is None:
        log.info("no SLURM_JOB_ID: not running as EpilogSlurmctld")
        return
    # Every collection step ends by worker_deadline_s; the analysis and the store follow. If
    # anything still holds the worker past that deadline plus a grace, SIGALRM ends it.
    signal.alarm(int(loaded.settings.worker_deadline_s + ALARM_GRACE_S))
    try:
        out = collect_job(job.job_id, loaded.settings, env_job=job,
                          notes=[f"config: {p}" for p in loaded.problems])
    finally:
        signal.alarm(0)
    log.info("%s", out.message)


def _detach(log_path: str) -> bool:
    """Double fork. Returns True in the worker, False in the caller."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)          # the middle child exits at once
        return False
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.chdir("/")
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        fd = open_log(log_path)     # O_NOFOLLOW; /dev/null when it cannot be opened safely
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, 1024)
        return True
    except BaseException:
        os._exit(0)


def main() -> int:
    t0 = time.monotonic()
    env = dict(os.environ)
    try:
        from ..config import load_for_hook
        log_dir = load_for_hook(env).settings.log_dir
    except Exception:
        log_dir = "/var/log/sattrib"
    log_path = os.path.join(log_dir, "worker.log")
    try:
        if os.environ.get("SATTRIB_FOREGROUND") != "1" and not _detach(log_path):
            return 0                                    # slurmctld's own process: done
    except OSError:
        pass                                            # cannot fork: do the work inline
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s sattrib-worker[%(process)d] %(message)s")
    try:
        _worker(env)
    except Exception:                   # a worker crash must not leave a trace in slurmctld
        log.exception("worker failed after %.1fs", time.monotonic() - t0)
    finally:
        logging.shutdown()
        if os.environ.get("SATTRIB_FOREGROUND") != "1":
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

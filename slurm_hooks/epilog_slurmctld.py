"""EpilogSlurmctld: queue the job and return; at most `worker_concurrency` workers diagnose.

slurmctld runs this as SlurmUser for every job that ends, concurrently with the node Epilogs,
and waits for it. So it only writes the job's entry into the queue (sattrib.jobqueue: written
whole, fsync'ed, renamed into place) and, when a worker slot is free, starts a worker, detached
in its own session (stdio on the worker log, no inherited descriptors). Until that fork it
imports nothing but the queue and the path settings (not the settings model, not logging):
under a storm of ending jobs on a busy controller it costs little more than Python's start,
whatever the queue's length. The worker (sattrib.worker) takes a slot within
worker_concurrency, or ends at once when others hold them all, and takes entries until the
queue is empty.

A job that finds every slot busy waits in the queue; one queued while no worker could start
(a crash, a restart of the controller) is taken by the worker the next EpilogSlurmctld starts,
or by `sattrib queue --run`.
"""
from __future__ import annotations

import os
import sys
import time

from .launch import open_log


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


def _say(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} sattrib-epilog-slurmctld[{os.getpid()}] "
          f"{msg}", file=sys.stderr, flush=True)


def _queue(env: dict) -> tuple[str, bool]:
    """Queue the job Slurm named, if any; (the worker log, whether to start a worker). The
    settings come from the configuration file alone (the environment gives SATTRIB_CONFIG)."""
    from .. import paths
    from ..jobqueue import Queue, queue_dir

    t0 = time.monotonic()
    own = {"SATTRIB_CONFIG": env["SATTRIB_CONFIG"]} if env.get("SATTRIB_CONFIG") else {}
    q = Queue(queue_dir(paths.database(None, None, own)))
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    restart = env.get("SLURM_JOB_RESTART_COUNT") or "0"
    restart = int(restart) if restart.isdigit() else 0
    if job:
        q.enqueue({"job_id": job, "restart": restart, "cluster": env.get("SLURM_CLUSTER_NAME"),
                   "queued_at": time.time(), "attempts": [],
                   "env": {k: v for k, v in env.items() if k.startswith("SLURM_")}})
    else:
        _say("no SLURM_JOB_ID: not running as EpilogSlurmctld")
    start = q.free_slot() and (bool(job) or q.has_work())
    if job:
        _say(f"job {job}.{restart} queued in {(time.monotonic() - t0) * 1000:.0f} ms; "
             + ("a worker starts" if start else "every worker is busy: it waits for one"))
    return os.path.join(paths.log_dir(None, own), "worker.log"), start


def main() -> int:
    env = dict(os.environ)
    foreground = env.get("SATTRIB_FOREGROUND") == "1"
    try:
        log_path, start = _queue(env)
    except Exception:                   # the one place a catch-all is right
        import traceback
        _say(f"cannot queue job {env.get('SLURM_JOB_ID')}:\n{traceback.format_exc()}")
        return 0
    if not start:
        return 0
    if not foreground:
        try:
            if not _detach(log_path):
                return 0                                # slurmctld's own process: done
        except OSError as e:
            _say(f"cannot start a worker ({e}): the job waits in the queue")
            return 0
    try:
        from ..worker import run_detached
        run_detached(env)
    except Exception:                   # a worker crash must not leave a trace in slurmctld
        import traceback
        traceback.print_exc()
    finally:
        import logging
        logging.shutdown()
        if not foreground:
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

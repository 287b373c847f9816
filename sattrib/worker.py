"""The controller's worker: takes the jobs EpilogSlurmctld queued (sattrib.jobqueue) and
diagnoses each in a child process of its own.

A worker runs only while it holds one of `worker_concurrency` slot locks. It takes entries
until the queue is empty; each job runs in a forked child that holds neither the slot nor the
claim (a reader it forks and abandons on a hung mount must not keep them) and that the kernel
kills if the worker dies (PR_SET_PDEATHSIG), so a killed worker frees its slot and leaves its
entry to be taken again. The child's peak memory is logged with each job; the worker itself
keeps nothing from one job to the next.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

from .jobqueue import Claim, Queue, queue_dir

log = logging.getLogger("sattrib.worker")
ALARM_GRACE_S = 120         # past worker_deadline_s, SIGALRM ends a job's child
REAP_GRACE_S = 30           # past that, the worker kills the child and goes on without it
NICE = 10                   # a job's child: diagnoses can wait, scheduling and hooks cannot


def work(q: Queue, st, slot: int) -> int:
    """Take entries until the queue is empty, each job diagnosed in a child process of its
    own (its memory goes with it; a job that kills its child costs one attempt, not the
    worker). Then let the slot go, decide what waited for the queue to empty and send the
    summary of held notifications if no other worker runs (the last to finish does), and look
    once more: a job queued while all slots looked busy is not left behind. Returns how many
    entries were taken."""
    _set_name("sattrib-worker")
    q.set_slots(st.worker_concurrency)
    q.tidy()
    _warm(st)
    taken = 0
    while slot is not None:
        before = taken
        while (c := q.claim(st.queue_max_attempts)) is not None:
            taken += 1
            why = _run_child(c, st, slot)
            if why is None:
                q.done(c)
            else:
                state = q.fail(c, why, st.queue_max_attempts)
                log.warning("job %s.%s: attempt %d failed: %s; %s", c.entry.get("job_id"),
                            c.entry.get("restart"), len(c.entry["attempts"]) + 1, why,
                            "set aside in failed/" if state == "failed" else "queued again")
        os.close(slot)
        if q.busy_slots() == 0:                 # the last worker to finish
            _when_empty(st)
        # (a round that took nothing ends it: what is left is another worker's to take)
        slot = q.slot(st.worker_concurrency) if taken > before and q.has_work() else None
    return taken


def _warm(st) -> None:
    """Import what each job's child needs and load the rules once, here: the children are
    forked with them (about a second of each job's time otherwise)."""
    try:
        from . import actions, collect, store  # noqa: F401
        from .analysis import load_rules
        load_rules(st.rules_dirs)
    except Exception:                   # each child meets the same problem, and reports it
        log.exception("preparing the worker failed")


def _when_empty(st) -> None:
    """The queue is empty: decide what waited for it (a failure a cross-job incident could
    still explain, sattrib.incidents.settle), then send the summary of held notifications."""
    try:
        from .actions import send_held
        from .incidents import settle
        from .store import open_store
        db = open_store(st.database)
        settle(db, st)
        if st.notify_url:
            send_held(db, st)
    except Exception:
        log.exception("deciding what waited for the queue, or sending the summary of held "
                      "notifications, failed")


def _run_child(c: Claim, st, slot: int) -> Optional[str]:
    """Diagnose the claimed job in a child; None when it finished, else why it did not. The
    child holds neither the slot nor the claim (its own forks, such as a reader stuck on a hung
    mount, must not keep them), and dies with the worker."""
    r, w = os.pipe()
    t0, parent = time.monotonic(), os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.close(slot)
            os.close(c.fd)
            _die_with(parent)
            _set_name("sattrib-job")
            os.nice(NICE)               # slurmctld and its hooks come first on the controller
            for k in [k for k in os.environ if k.startswith("SLURM_")]:
                del os.environ[k]
            os.environ.update(c.entry["env"])       # the job's own EpilogSlurmctld facts
            diagnose(dict(os.environ), c.entry.get("queued_at"))
            code = 0
        except BaseException as e:
            log.exception("job %s: the diagnosis failed", c.entry.get("job_id"))
            os.write(w, f"{type(e).__name__}: {e}"[:400].encode("utf-8", "replace"))
        finally:
            logging.shutdown()
            os._exit(code)
    os.close(w)
    try:
        status, rss_kb = _reap(pid, st.worker_deadline_s + ALARM_GRACE_S + REAP_GRACE_S)
        os.set_blocking(r, False)
        try:
            said = os.read(r, 1024).decode("utf-8", "replace")
        except BlockingIOError:
            said = ""
    finally:
        os.close(r)
    log.info("job %s.%s: child %d ended in %.1fs (peak RSS %d MB)", c.entry.get("job_id"),
             c.entry.get("restart"), pid, time.monotonic() - t0, rss_kb // 1024)
    if status is None:
        return "its child was killed at the deadline and did not end: abandoned"
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return None if code == 0 else (said or f"its child exited {code}")
    sig = os.WTERMSIG(status)
    return f"its child was killed by signal {sig}" + (
        " (worker_deadline_s)" if sig == signal.SIGALRM else "")


def _reap(pid: int, limit_s: float) -> tuple[Optional[int], int]:
    """(wait status, peak RSS in KiB) of the child; it is killed at `limit_s`, and abandoned
    (status None) if it does not end even then (stuck in the kernel)."""
    end, killed = time.monotonic() + limit_s, False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage.ru_maxrss
        if time.monotonic() > end:
            if killed:
                return None, 0
            os.kill(pid, signal.SIGKILL)
            end, killed = time.monotonic() + 5, True
        time.sleep(0.05)


def _die_with(parent: int) -> None:
    """The kernel kills this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:           # the parent died before the call
        os._exit(1)


def _yield_to_slurmctld() -> None:
    """The detached worker's session at nice 10. Where the kernel groups processes by session
    for the scheduler (autogroup, on by default on most distributions), a process's own nice
    only orders it within its session, and a worker's new session would otherwise weigh as
    much as slurmctld's, which runs every EpilogSlurmctld."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(NICE))
    except OSError:
        pass                            # no autogroup: the job children's own nice does it


def _set_name(name: str) -> None:
    """What `ps -e` and /proc/PID/comm show: sattrib-worker, sattrib-job."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass


def diagnose(env: dict, queued_at: Optional[float] = None) -> None:
    """Diagnose one job from its EpilogSlurmctld environment: what a worker runs for each
    entry. The settings are read as the hooks read them: a typo in sattrib.toml costs that one
    setting its value, never the diagnosis, and the diagnosis says so. The snapshot wait runs
    from `queued_at` (the job's end), so a job that waited in the queue does not wait again."""
    from .collect import collect_job
    from .collectors import slurm_env
    from .config import load_for_hook

    loaded = load_for_hook(env)
    for p in loaded.problems:
        log.warning("config: %s", p)
    job = slurm_env.from_env(env)
    if job is None:
        log.info("no SLURM_JOB_ID: not running as EpilogSlurmctld")
        return
    # Every collection step ends by worker_deadline_s; the analysis and the store follow. If
    # anything still holds the job past that deadline plus a grace, SIGALRM ends it.
    signal.alarm(int(loaded.settings.worker_deadline_s + ALARM_GRACE_S))
    try:
        out = collect_job(job.job_id, loaded.settings, env_job=job, ended=queued_at,
                          notes=[f"config: {p}" for p in loaded.problems])
    finally:
        signal.alarm(0)
    log.info("%s", out.message)


def run_detached(env: dict) -> None:
    """The worker EpilogSlurmctld started (detached, stdio on worker.log): the settings as the
    hooks read them, a slot within worker_concurrency (or nothing to do: others hold them),
    then the queue until it is empty."""
    from .config import load_for_hook
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s sattrib-worker[%(process)d] %(message)s")
    loaded = load_for_hook(env)
    for p in loaded.problems:
        log.warning("config: %s", p)
    st = loaded.settings
    _yield_to_slurmctld()
    q = Queue(queue_dir(st.database))
    slot = q.slot(st.worker_concurrency)
    if slot is not None:
        work(q, st, slot)

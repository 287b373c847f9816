"""The controller's job queue (sattrib.jobqueue) with real processes, real flocks and real
forks: entries written whole, claimed once, taken again when their worker dies, set aside after
queue_max_attempts, at most worker_concurrency workers, memory and the hook's time independent
of the queue's length. The same on a real Slurm cluster: tests/integration/test_storm.py.

Here a job's diagnosis is a stand-in (it records when it ran, or dies): everything around it
(the queue, the slots, the detached workers and their children) is the real code."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest
from click.testing import CliRunner

from sattrib import jobqueue, worker
from sattrib.cli import main
from sattrib.config import Settings
from sattrib.jobqueue import Queue, queue_dir

def entry(job, **kw):
    return {"job_id": str(job), "restart": 0, "cluster": "c1", "queued_at": time.time(),
            "attempts": [], "env": {"SLURM_JOB_ID": str(job), **kw}}


def settings(tmp_path, **kw):
    return Settings(database=str(tmp_path / "var" / "d.db"), bundle_dir=str(tmp_path / "b"),
                    log_dir=str(tmp_path), **kw)


@pytest.fixture
def q(tmp_path):
    (tmp_path / "var").mkdir()
    return Queue(queue_dir(str(tmp_path / "var" / "d.db")))


@pytest.fixture
def ran(tmp_path, monkeypatch):
    """The stand-in diagnosis: appends "job start end pid" to a file; job 666 kills its own
    process, job 667 raises. Forked children inherit it."""
    out = tmp_path / "ran.txt"

    def diagnose(env, queued_at=None):
        job = env["SLURM_JOB_ID"]
        if job == "666":
            os.kill(os.getpid(), signal.SIGKILL)
        if job == "667":
            raise RuntimeError("database is locked")
        t0 = time.time()
        time.sleep(float(env.get("SLURM_TEST_SLEEP", "0")))
        with open(out, "a") as f:
            f.write(f"{job} {t0} {time.time()} {os.getpid()}\n")
    monkeypatch.setattr(worker, "diagnose", diagnose)
    return lambda: [ln.split() for ln in out.read_text().splitlines()] if out.exists() else []


def names(q, state):
    return sorted(os.listdir(q.root / state))


def test_an_entry_is_written_whole_and_durably_or_not_at_all(q):
    name = q.enqueue(entry(7001))
    assert names(q, "pending") == [name] and names(q, "tmp") == []
    assert json.loads((q.root / "pending" / name).read_text())["env"] == {"SLURM_JOB_ID": "7001"}
    assert oct((q.root / "pending" / name).stat().st_mode & 0o777) == "0o600"
    assert oct(q.root.stat().st_mode & 0o777) == "0o700"
    # what an enqueue killed half-way leaves in tmp/ is never taken, and tidied away later
    half = q.root / "tmp" / "00000000000000000001-1-7002.0.json"
    half.write_text('{"job_id": "70')
    os.utime(half, (time.time() - 7200,) * 2)
    c = q.claim(3)
    assert c.entry["job_id"] == "7001" and q.claim(3) is None
    q.tidy()
    assert names(q, "tmp") == []


def test_the_queue_is_made_where_the_database_goes(tmp_path):
    q = Queue(queue_dir(str(tmp_path / "new" / "sattrib" / "d.db")))
    assert q.root == tmp_path / "new" / "sattrib" / "queue" and q.owned()
    assert sorted(os.listdir(q.root)) == ["claimed", "failed", "pending", "slots", "tmp"]


def test_a_queue_others_can_write_is_refused(q):
    os.chmod(q.root / "pending", 0o777)
    with pytest.raises(jobqueue.QueueError, match="writable by others"):
        Queue(q.root)


def test_the_oldest_entry_is_claimed_once_across_processes(q):
    first, second = q.enqueue(entry(1)), q.enqueue(entry(2))
    mine = q.claim(3)
    assert mine.path.name == first and names(q, "claimed") == [first]
    # another process claims while this one holds the first: it gets the second
    code = ("import sys; from sattrib.jobqueue import Queue\n"
            f"c = Queue({str(q.root)!r}).claim(3)\nprint(c.entry['job_id'] if c else None)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "2"
    # its process ended: its claim is an orphan; mine is still held
    listing = q.listing(10)["claimed"]["entries"]
    assert {e["job_id"]: e["worker"] for e in listing} == {
        "1": "running", "2": "none (orphan: the next claim puts it back)"}
    q.done(mine)
    assert names(q, "claimed") == [second]


def test_an_entry_whose_worker_was_killed_is_taken_again(q):
    q.enqueue(entry(42))
    code = ("import os, signal; from sattrib.jobqueue import Queue\n"
            f"c = Queue({str(q.root)!r}).claim(3)\nassert c.entry['job_id'] == '42'\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert names(q, "pending") == [] and len(names(q, "claimed")) == 1
    assert q.has_work()
    c = q.claim(3)
    assert c.entry["job_id"] == "42" and len(c.entry["attempts"]) == 1
    assert "its worker stopped before finishing it" in c.entry["attempts"][0]["why"]


def test_a_poison_entry_is_set_aside_after_max_attempts_and_the_rest_is_done(q, tmp_path, ran):
    for job in (1, 666, 2, 667, 3):
        q.enqueue(entry(job))
    st = settings(tmp_path, queue_max_attempts=3)
    taken = worker.work(q, st, q.slot(st.worker_concurrency))
    assert sorted(r[0] for r in ran()) == ["1", "2", "3"]
    assert taken == 3 + 3 + 3                  # each good job once, each poison one 3 times
    assert names(q, "pending") == names(q, "claimed") == []
    failed = {e["job_id"]: e for e in q.listing(10)["failed"]["entries"]}
    assert set(failed) == {"666", "667"}
    assert failed["666"]["attempts"] == 3 and failed["666"]["why"] == \
        "its child was killed by signal 9"
    assert failed["667"]["why"] == "RuntimeError: database is locked"
    assert q.busy_slots() == 0                  # the worker let its slot go
    assert q.retry_failed() == 2 and len(names(q, "pending")) == 2
    assert all(not json.loads((q.root / "pending" / n).read_text())["attempts"]
               for n in names(q, "pending"))


def test_after_a_crash_a_new_worker_takes_everything_left(q, tmp_path, ran):
    """What a controller that lost power leaves: entries waiting, one claimed by a worker
    that is gone, and a half-written one. The next worker does every job once."""
    for job in (11, 12, 13):
        q.enqueue(entry(job))
    code = f"from sattrib.jobqueue import Queue\nQueue({str(q.root)!r}).claim(3)\n"
    subprocess.run([sys.executable, "-c", code], check=True)      # claimed, then gone
    (q.root / "tmp" / "x.json").write_text("{")
    assert len(names(q, "claimed")) == 1
    st = settings(tmp_path)
    worker.work(q, st, q.slot(st.worker_concurrency))
    assert sorted(r[0] for r in ran()) == ["11", "12", "13"]
    assert names(q, "pending") == names(q, "claimed") == names(q, "failed") == []


HOOK = textwrap.dedent("""\
    import os, sys, time
    from sattrib import jobqueue, worker

    def diagnose(env, queued_at=None):            # the stand-in: 0.5 s, then a record
        t0 = time.time()
        time.sleep(0.5)
        with open(env["SLURM_TEST_OUT"], "a") as f:
            f.write(f"{env['SLURM_JOB_ID']} {t0} {time.time()} {os.getpid()}\\n")
    worker.diagnose = diagnose
    from sattrib.slurm_hooks.epilog_slurmctld import main
    main()
    """)


def _hook_env(tmp_path, job, cfg):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SATTRIB_"))}
    env.update(SATTRIB_CONFIG=str(cfg), SLURM_JOB_ID=str(job), SLURM_CLUSTER_NAME="c1",
               SLURM_TEST_OUT=str(tmp_path / "ran.txt"), SLURM_JOB_EXIT_CODE2="1:0")
    return env


def test_a_burst_of_hooks_runs_at_most_worker_concurrency_workers(tmp_path):
    """16 EpilogSlurmctld processes at once, each returning at once; their detached workers
    diagnose every job exactly once, never more than 2 at a time."""
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'database = "{tmp_path / "var" / "d.db"}"\nlog_dir = "{tmp_path}"\n'
                   "worker_concurrency = 2\n")
    (tmp_path / "var").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", HOOK],
                              env=_hook_env(tmp_path, 9000 + i, cfg), cwd="/")
             for i in range(16)]
    assert all(p.wait(timeout=30) == 0 for p in procs)
    out = tmp_path / "ran.txt"
    done_when_hooks_returned = len(out.read_text().splitlines()) if out.exists() else 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = [ln.split() for ln in out.read_text().splitlines()] if out.exists() else []
        if len(rows) >= 16:
            break
        time.sleep(0.2)
    time.sleep(1.0)                             # nothing more may come
    rows = [ln.split() for ln in out.read_text().splitlines()]
    assert sorted(r[0] for r in rows) == [str(9000 + i) for i in range(16)]
    events = sorted([(float(r[1]), 1) for r in rows] + [(float(r[2]), -1) for r in rows])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2, events                    # both slots used, never a third
    assert done_when_hooks_returned < 16        # the hooks did not wait for the jobs
    assert len({r[3] for r in rows}) == 16      # each job in a child process of its own
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


def test_a_job_that_ends_while_one_worker_runs_starts_the_second(tmp_path):
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'database = "{tmp_path / "var" / "d.db"}"\nlog_dir = "{tmp_path}"\n')
    (tmp_path / "var").mkdir()
    out = tmp_path / "ran.txt"
    # The first job's diagnosis lasts until the second's has begun (30 s at most): with one
    # worker only, the second begins after the first ends, however loaded the machine is.
    started = tmp_path / "second-started"
    waits = HOOK.replace("time.sleep(0.5)",
                         f"open({str(started)!r}, 'a').close() if env['SLURM_JOB_ID'] == '2' else "
                         f"[time.sleep(0.05) for _ in range(600) if not os.path.exists("
                         f"{str(started)!r})]")
    first = subprocess.run([sys.executable, "-c", waits],
                           env=_hook_env(tmp_path, 1, cfg), cwd="/", timeout=30)
    q = Queue(queue_dir(str(tmp_path / "var" / "d.db")))
    deadline = time.monotonic() + 20
    while not os.listdir(q.root / "claimed"):          # the first job is being diagnosed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", waits],
                            env=_hook_env(tmp_path, 2, cfg), cwd="/", timeout=30)
    assert first.returncode == second.returncode == 0
    while len(out.read_text().splitlines() if out.exists() else []) < 2:
        assert time.monotonic() < deadline + 20
        time.sleep(0.1)
    (a0, a1), (b0, b1) = sorted((float(r[1]), float(r[2])) for r in
                                (ln.split() for ln in out.read_text().splitlines()))
    assert b0 < a1, "the second job waited for the first: only one worker ran"


def _hook(env) -> tuple[str, float, float]:
    """The hook run as the installed wrapper runs it: (its log, wall seconds, CPU seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-I", "-m", "sattrib.slurm_hooks.epilog_slurmctld"],
                         env=env, stderr=subprocess.PIPE, text=True, cwd="/")
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = 0
    assert os.waitstatus_to_exitcode(status) == 0, err
    return err, time.monotonic() - t0, usage.ru_utime + usage.ru_stime


def test_the_hook_and_a_claim_cost_the_same_whatever_the_queue_length(q, tmp_path):
    busy = [q.slot(2), q.slot(2)]               # every worker busy: the hook only queues
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'database = "{tmp_path / "var" / "d.db"}"\nlog_dir = "{tmp_path}"\n')
    short = [_hook(_hook_env(tmp_path, 500 + i, cfg)) for i in range(3)]
    for i in range(10000):                      # a long queue (written directly: fast)
        (q.root / "pending" / f"{i:020d}-1-{i}.0.json").write_text(
            json.dumps(entry(100000 + i)))
    long = [_hook(_hook_env(tmp_path, 600 + i, cfg)) for i in range(3)]
    err = long[0][0]
    assert "job 600.0 queued" in err and "every worker is busy: it waits for one" in err, err
    cpu_short, cpu_long = min(h[2] for h in short), min(h[2] for h in long)
    wall_long = min(h[1] for h in long)
    print(f"\nhook: {cpu_short:.3f} s CPU with 3 queued, {cpu_long:.3f} s with 10,003; "
          f"wall {wall_long:.3f} s (Python's start included)")
    assert cpu_long < 0.5 and cpu_long - cpu_short < 0.05, (short, long)
    assert wall_long < 2.0, long                # a busy 2-core test machine; ~0.2 s idle
    assert len(names(q, "pending")) == 10006
    tracemalloc.start()
    c = q.claim(3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert c.entry["job_id"] == "100000"          # the oldest
    assert peak < 64 << 10, peak                # the listing of 10,006 names is ~1 MB
    for fd in busy:
        os.close(fd)


def test_sattrib_queue_lists_and_runs_the_queue(q, tmp_path, ran, monkeypatch):
    monkeypatch.setenv("SATTRIB_DATABASE", str(tmp_path / "var" / "d.db"))
    monkeypatch.setenv("SATTRIB_BUNDLE_DIR", str(tmp_path / "b"))
    for job in (21, 666, 22):
        q.enqueue(entry(job))
    r = CliRunner().invoke(main, ["queue"])
    assert r.exit_code == 0, r.output
    assert f"queue {q.root}: 3 pending, 0 claimed, 0 failed; 0 of 2 workers running" in r.output
    assert [ln.split()[:2] for ln in r.output.splitlines()[2:]] == [
        ["pending", "21"], ["pending", "666"], ["pending", "22"]]
    r = CliRunner().invoke(main, ["queue", "--run"])
    assert r.exit_code == 0 and "5 queued jobs taken" in r.output, r.output
    assert sorted(x[0] for x in ran()) == ["21", "22"]
    doc = json.loads(CliRunner().invoke(main, ["queue", "--json"]).output)
    assert (doc["pending"]["count"], doc["failed"]["count"]) == (0, 1)
    assert doc["failed"]["entries"][0]["why"] == "its child was killed by signal 9"
    r = CliRunner().invoke(main, ["queue", "--retry"])
    assert r.exit_code == 0 and "1 pending, 0 claimed, 0 failed" in r.output

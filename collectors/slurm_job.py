"""Controller-side scheduler facts and the job's own output, read with deadlines and care.

Scheduler state comes from pyslurm when it imports and matches the installed Slurm, otherwise
from `scontrol show job -d`, `scontrol show node -o` and `sacct -P` (when accounting works).
The job's stdout/stderr are written by the user: they are read only if they are regular files
owned by the job's user (no symlinks, no FIFOs), and only up to a size cap (head and tail kept),
in a child process that is killed and abandoned at the deadline (a file on a hung NFS mount
blocks open() or read() in the kernel, where no timeout reaches).
"""
from __future__ import annotations

import errno
import glob
import json
import os
import re
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import probe, slurm_state
from .reader import SkipFile, become, open_regular

FINAL_WAIT_STATES = {"COMPLETING", "RUNNING", "CONFIGURING", "SUSPENDED", "STAGE_OUT",
                     "RESIZING", "SIGNALING"}


@dataclass
class SchedulerFacts:
    job_text: str = ""
    nodes_text: str = ""
    sacct_text: str = ""
    source: str = ""
    notes: list = field(default_factory=list)


_NO_JSON: list = []        # set once scontrol says it has no --json (Slurm before 23.02)


def scontrol_job(job_id: str, deadline: float) -> tuple[str, str]:
    """`scontrol show job -d`, as --json where scontrol has it (23.02 on: every field exact),
    else as text (slurm_state.parse_kv reads it by Slurm's order of keys)."""
    if not _NO_JSON:
        r = probe.run("scontrol", ["scontrol", "--json", "show", "job", "-d", str(job_id)],
                      deadline, max_bytes=4 << 20)
        if r.ok and r.out.lstrip().startswith(b"{"):
            return r.out.decode("utf-8", "replace"), ""
        if b"unrecognized option" in r.err:
            _NO_JSON.append(True)
    r = probe.run("scontrol", ["scontrol", "show", "job", "-d", str(job_id)], deadline,
                  max_bytes=4 << 20)
    if r.ok:
        return r.out.decode("utf-8", "replace"), ""
    return "", (r.err.decode("utf-8", "replace").strip() or r.reason)[:300]


def cluster_name(deadline: float) -> Optional[str]:
    """ClusterName from `scontrol show config` (what the hooks see as SLURM_CLUSTER_NAME)."""
    r = probe.run("scontrol", ["scontrol", "show", "config"], deadline, max_bytes=1 << 20)
    m = re.search(r"^ClusterName\s*=\s*(\S+)", r.out.decode("utf-8", "replace"), re.M)
    return m.group(1) if r.ok and m else None


def scontrol_nodes(nodes: list, deadline: float) -> str:
    if not nodes:
        return ""
    from ..engine.hostlist import compress
    r = probe.run("scontrol", ["scontrol", "show", "node", "-o", compress(nodes)], deadline,
                  max_bytes=8 << 20)
    return r.out.decode("utf-8", "replace") if r.ok else ""


def sacct(job_id: str, deadline: float) -> str:
    # Only columns Slurm writes: a job name may hold `|` and line breaks.
    r = probe.run("sacct", ["sacct", "-j", str(job_id), "-P", "-o",
                            "JobID,Partition,User,State,ExitCode,Start,End,NodeList",
                            "--duplicates"], deadline, max_bytes=4 << 20)
    return r.out.decode("utf-8", "replace") if r.ok else ""


def pyslurm_job(job_id: str) -> Optional[str]:
    """The job as `scontrol show job --json` prints it, built from pyslurm, when pyslurm imports
    and was built for the Slurm that is installed; None otherwise."""
    try:
        import pyslurm  # noqa: PLC0415 - optional, never imported at import time
    except Exception:
        return None
    try:
        lib = pyslurm.version() if hasattr(pyslurm, "version") else ""
        import time
        r = probe.run("scontrol", ["scontrol", "--version"], time.monotonic() + 5,
                      max_bytes=4096)
        installed = re.search(r"(\d+)\.(\d+)", r.out.decode())
        ours = re.search(r"(\d+)\.(\d+)", str(lib))
        if not installed or not ours or installed.groups() != ours.groups():
            return None
        job = pyslurm.Job.load(int(job_id.split("_")[0]))
    except Exception:
        return None
    rec = {"job_id": int(job_id) if job_id.isdigit() else None,
           "name": getattr(job, "name", None), "user_name": getattr(job, "user_name", None),
           "user_id": getattr(job, "user_id", None), "job_state": getattr(job, "state", None),
           "state_reason": getattr(job, "state_reason", None),
           "restart_cnt": getattr(job, "requeue_count", None) or getattr(job, "restart_cnt", 0),
           "nodes": getattr(job, "nodes", None), "partition": getattr(job, "partition", None),
           "current_working_directory": getattr(job, "working_directory", None),
           "standard_output": getattr(job, "standard_output", None),
           "standard_error": getattr(job, "standard_error", None)}
    # As --json prints a job: its values cannot be mistaken for keys.
    return json.dumps({"jobs": [{k: v for k, v in rec.items() if isinstance(v, (str, int))}]},
                      indent=1) + "\n"


def env_info(job) -> dict:
    """The facts slurmctld passed in EpilogSlurmctld's environment (a slurm_env.JobEnv), keyed
    as `scontrol show job` names them: what is known when scontrol cannot reach slurmctld."""
    from ..engine.hostlist import compress
    info = {"JobId": job.job_id, "JobName": job.name, "User": job.user,
            "Uid": str(job.uid) if job.uid is not None else None,
            "UserId": f"{job.user}({job.uid})" if job.user and job.uid is not None else None,
            "Partition": job.partition, "NodeList": compress(job.nodes) if job.nodes else None,
            "Restarts": str(job.restart), "StdOut": job.stdout, "StdErr": job.stderr,
            "WorkDir": job.work_dir, "ArrayJobId": job.array_job, "ArrayTaskId": job.array_task}
    return {k: v for k, v in info.items() if v not in (None, "")}


# Facts slurmctld gives exactly (EpilogSlurmctld's environment, or squeue's fields when a
# person runs `sattrib collect`): scontrol's record may complete them, never override them.
EXACT = ("JobId", "JobName", "User", "Uid", "UserId", "Partition", "NodeList", "StdOut",
         "StdErr", "WorkDir", "ArrayJobId", "ArrayTaskId")


def job_facts(record: dict, exact: dict, notes: list) -> dict:
    """The job's facts: `exact` ones (env_info, squeue_facts) completed by scontrol's
    `record` (slurm_state.parse_kv). A record whose name, uid or working directory differ
    from the exact ones was misread (a field the job's user wrote holds a line break): only its
    job id is used, and a note says why."""
    why = record.get("Ambiguous") or next(
        (f"its {k} is not the one slurmctld gave" for k in ("JobName", "Uid", "WorkDir")
         if exact.get(k) and record.get(k) not in (None, "", exact[k])), "")
    if why:
        notes.append(f"scontrol's record of job {record.get('JobId')} was not used: {why}")
        record = {"JobId": record["JobId"]} if record.get("JobId") else {}
    return {**exact, **record, **{k: exact[k] for k in EXACT if exact.get(k)}}


def squeue_facts(job_id: str, deadline: float) -> dict:
    """Whose job it is, as squeue prints it (fields Slurm writes, the name last and whole):
    what `sattrib collect` has in place of EpilogSlurmctld's environment. {} when squeue does
    not show exactly this one job."""
    r = probe.run("squeue", ["squeue", "-h", "-t", "all", "-j", str(job_id), "-o",
                             "%A|%U|%u|%P|%N|%j"], deadline, max_bytes=1 << 20)
    out = r.out.decode("utf-8", "replace").removesuffix("\n")      # the name ends the line
    m = re.fullmatch(r"(\d+)\|(\d+)\|([^|\n]*)\|([^|\n]*)\|([^|\n]*)\|(.*)", out,
                     re.S) if r.ok else None
    if not m or (job_id.isdigit() and m.group(1) != job_id):
        return {}
    jid, uid, user, partition, nodes, name = m.groups()
    out = {"JobId": jid, "Uid": uid, "User": user, "UserId": f"{user}({uid})",
           "Partition": partition, "JobName": name}
    if nodes and nodes != "(null)":
        out["NodeList"] = nodes
    return out


def wait_final(job_id: str, deadline: float, poll: float = 1.0):
    """`scontrol show job` until the job has left COMPLETING (or the deadline passes)."""
    import time
    text, err = "", ""
    while True:
        text, err = scontrol_job(job_id, min(deadline, time.monotonic() + 10))
        state = slurm_state.parse_kv(text, job_id).get("JobState") if text else None
        if (state or "") not in FINAL_WAIT_STATES:
            return text, err
        if time.monotonic() + poll > deadline:
            return text, err
        time.sleep(poll)


# --------------------------------------------------------------------------------------------
# The job's own output
# --------------------------------------------------------------------------------------------


def expand_pattern(pattern: str, job_id: str, name: str = "", user: str = "",
                   node: str = "", array_job: str = "", array_task: str = "",
                   index: str = "0", task: str = "0") -> str:
    """sbatch filename patterns: %j %J %x %u %N %n %t %A %a %%; `%3a`-style padding too.
    `node` is %N (the short host name), `index` %n (the node's index in the job), `task` %t."""
    def rep(m):
        width, key = m.group(1), m.group(2)
        val = {"j": job_id, "J": job_id, "x": name, "u": user, "N": node, "n": index,
               "t": task, "A": array_job or job_id, "a": array_task or "", "s": "batch",
               "%": "%"}.get(key, m.group(0))
        return val.zfill(int(width)) if width and val.isdigit() else val
    return re.sub(r"%(\d*)([jJxuNntAas%])", rep, pattern)


# A pattern with one of these names one file per node (%N, %n) or per task (%t).
PER_NODE = re.compile(r"%\d*[Nn]")
PER_TASK = re.compile(r"%\d*t")
MAX_EXPANSIONS = 20_000


def _user_fields(info: dict, notes: list, globs: list) -> tuple[dict, list]:
    """The fields a user chooses, and the site globs they may go into: a value with a '/' or
    '..' is refused there (it could widen the glob or lead it out of the working directory)."""
    fields = {"job name (%x)": info.get("JobName", ""), "user (%u)": info.get("User", "")}
    unsafe = [f"{what} {v!r}" for what, v in fields.items() if "/" in v or ".." in v]
    usable = []
    for g in globs:
        if unsafe and re.search(r"%\d*[xu]", g):
            notes.append(f"extra_output_globs {g!r} not used: the {', '.join(unsafe)} has a "
                         "'/' or '..'")
            continue
        usable.append(g)
    return fields, usable


def _unique(paths) -> list[str]:
    seen, out = set(), []
    for p in paths:
        p = os.path.normpath(p)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def output_paths(info: dict, extra_globs: list, notes: Optional[list] = None,
                 nodes: Optional[list] = None) -> list[str]:
    """StdOut/StdErr of the job plus the site's extra per-rank globs, absolute and unique.

    A StdOut/StdErr pattern with %N, %n or %t names a file per node or task: the batch host's
    (as today) first, then every other node's (`nodes`) and task's (NumTasks) that exists.
    In the site's globs, %N %n %t match any value, and the fields a user chooses (the job
    name %x, the user %u, the working directory) are literal text, never glob syntax."""
    notes = [] if notes is None else notes
    nodes = list(nodes or [])
    work = info.get("WorkDir") or "/"
    job_id = info.get("JobId", "")
    array = (info.get("ArrayJobId", ""), info.get("ArrayTaskId", ""))
    paths = []
    for key in ("StdOut", "StdErr"):
        p = info.get(key)
        if not p or p in ("(null)", "/dev/null"):
            continue

        def path(node, index="0", task="0"):
            q = expand_pattern(p, job_id, info.get("JobName", ""), info.get("User", ""),
                               node, *array, index=index, task=task)
            return q if os.path.isabs(q) else os.path.join(work, q)
        # As Slurm itself expanded it for the batch script.
        first = path(info.get("BatchHost", ""))
        paths.append(first)
        tasks = int(info["NumTasks"]) if str(info.get("NumTasks", "")).isdigit() else 1
        node_vals = list(enumerate(nodes)) if PER_NODE.search(p) else [
            (0, info.get("BatchHost", ""))]
        task_vals = range(min(tasks, MAX_EXPANSIONS)) if PER_TASK.search(p) else [0]
        if len(node_vals) * len(task_vals) > 1:
            more = (path(n, str(i), str(t)) for i, n in node_vals for t in task_vals)
            paths.extend(q for _, q in zip(range(MAX_EXPANSIONS), more)
                         if q != first and os.path.lexists(q))
    fields, globs = _user_fields(info, notes, extra_globs)
    esc = {k: glob.escape(v) for k, v in fields.items()}
    for g in globs:
        g = expand_pattern(g, glob.escape(job_id), esc["job name (%x)"], esc["user (%u)"],
                           "*", *(glob.escape(a) for a in array), index="*", task="*")
        g = g if os.path.isabs(g) else os.path.join(glob.escape(work), g)
        paths.extend(sorted(glob.glob(g))[:2000])
    return _unique(paths)


def output_paths_as_user(user: tuple, deadline: float, info: dict, extra_globs: list,
                         notes: list, nodes: Optional[list] = None) -> list[str]:
    """output_paths, looked up by a child process that reads as the job's user (`user` =
    (uid, gid), in_child): the folders the user named are listed with the user's permissions,
    never root's, and a folder on a hung mount costs the deadline, not the worker."""
    def find(_):
        found: list = []
        return {"paths": output_paths(info, extra_globs, found, nodes), "notes": found}
    try:
        done, _ = in_child(1, find, deadline, as_user=user)
    except OSError as e:
        notes.append(f"job output not looked for: {e.strerror}")
        return []
    if not done:
        notes.append("job output not looked for: its folders did not answer in time")
        return []
    notes.extend(done[0]["notes"])
    return done[0]["paths"]


def node_output_paths(job, host: str, extra_globs: list, notes: Optional[list] = None
                      ) -> list[str]:
    """The job's output files that belong to this node, as its Epilog sees them: those of a
    StdOut/StdErr pattern or site glob with a per-node part, %N = this host's short name,
    %n = its index in the job's node list, %t = any task (the node part says whose it is).
    `job` is the Epilog's slurm_env.JobEnv. A pattern with no per-node part is left to the
    controller."""
    notes = [] if notes is None else notes
    index = str(job.nodes.index(job.node)) if job.node in (job.nodes or []) else None
    info = {"JobName": job.name or "", "User": job.user or ""}
    fields, globs = _user_fields(info, notes, extra_globs)
    esc = {k: glob.escape(v) for k, v in fields.items()}
    # The user's own patterns are literal text; the site's globs are glob syntax.
    patterns = [glob.escape(p) for p in (job.stdout, job.stderr)
                if p and p not in ("(null)", "/dev/null")] + globs
    work = glob.escape(job.work_dir or "/")
    array = [glob.escape(a or "") for a in (job.array_job, job.array_task)]
    paths = []
    for g in patterns:
        if not PER_NODE.search(g) or (index is None and re.search(r"%\d*n", g)):
            continue
        g = expand_pattern(g, glob.escape(job.job_id), esc["job name (%x)"], esc["user (%u)"],
                           glob.escape(host), *array, index=index or "", task="[0-9]*")
        g = g if os.path.isabs(g) else os.path.join(work, g)
        paths.extend(sorted(glob.glob(g))[:2000])
    return _unique(paths)


def copy_output(src: str, out: int, owner: Optional[int], cap: int, notes: list) -> bool:
    """Copy one output file safely into the open descriptor `out`: regular, owned by the job's
    user, head+tail within cap."""
    try:
        fd, st = open_regular(src, owner=owner)
    except SkipFile as e:
        notes.append(f"{src}: {e}")
        return False
    try:
        if st.st_size <= cap:
            pos = 0
            while pos < st.st_size:
                chunk = os.pread(fd, min(8 << 20, st.st_size - pos), pos)
                if not chunk:
                    break
                _write_all(out, chunk)
                pos += len(chunk)
        else:
            half = cap // 2
            _write_all(out, os.pread(fd, half, 0))
            _write_all(out, os.pread(fd, half, st.st_size - half))
            notes.append(f"{src}: {st.st_size} bytes, kept the first and last {half} bytes")
    except OSError as e:
        notes.append(f"{src}: cannot copy ({e.strerror})")
        return False
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def in_child(count: int, work, deadline: float, as_user: Optional[tuple] = None,
             setup=None) -> tuple[dict, bool]:
    """work(i) -> a JSON-able dict, for i in range(count), in a child process: {i: result}
    for those it finished, and whether the deadline stopped it. At the deadline the child is
    killed and abandoned (never waited for): a file on a hung NFS mount blocks open() or
    read() in the kernel, where no timeout reaches.

    `setup()`, when given, runs first in the child with this process's privileges (loading the
    rules); then, with `as_user` = (uid, gid) of the job's user, the child gives up root for
    that user (reader.become) before any work(i) looks at a path the user chose. Raises OSError
    when the child cannot start or cannot become the job's user."""
    if not count:
        return {}, False
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:                                     # the child: work, report, exit
        try:
            os.close(r)
            _child(count, work, w, as_user, setup)
        finally:
            os._exit(0)
    os.close(w)
    buf, done, timed_out, failed = b"", {}, False, None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break                                 # the child finished
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                rec = json.loads(ln)
                if "failed" in rec:
                    failed = rec["failed"]
                else:
                    done[rec["i"]] = rec["r"]
    finally:
        os.close(r)
        if len(done) < count:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        t_reap = time.monotonic() + 0.2               # reaped if it goes; never waited for
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < t_reap:
                time.sleep(0.01)
        except ChildProcessError:
            pass
    if failed is not None:
        raise OSError(errno.EPERM, failed)
    return done, timed_out


def _child(count: int, work, w: int, as_user: Optional[tuple], setup) -> None:
    def send(rec: dict) -> None:
        _write_all(w, (json.dumps(rec) + "\n").encode())
    try:
        if setup is not None:
            setup()
        if as_user is not None:
            become(*as_user)
    except OSError as e:
        send({"failed": e.strerror or str(e)})
        return
    for i in range(count):
        send({"i": i, "r": work(i)})


COPY_BATCH = 256               # output files one reader process copies (descriptors it holds)


def copy_outputs(pairs: list, owner: Optional[int], cap: int, notes: list,
                 deadline: float, gid: Optional[int] = None) -> int:
    """copy_output for each (src, dest) in a child process (in_child) that reads as the job's
    user (`owner`, `gid`): this process creates each copy and the child, once it has given up
    root, writes into the descriptor it inherited. Returns how many were copied. At the
    deadline the file it was on and those after it are noted as not read, and their partial
    copies removed."""
    t0 = time.monotonic()
    copied = 0
    for start in range(0, len(pairs), COPY_BATCH):
        batch = pairs[start:start + COPY_BATCH]
        outs: list = []

        def work(i, batch=batch, outs=outs):
            sub: list = []
            return {"ok": copy_output(batch[i][0], outs[i], owner, cap, sub), "notes": sub}
        try:
            for _, dest in batch:
                outs.append(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                                    | os.O_CLOEXEC, 0o640))
            done, timed_out = in_child(len(batch), work, deadline, as_user=(owner, gid))
            why = None
        except OSError as e:
            done, timed_out, why = {}, False, e.strerror
        finally:
            for fd in outs:
                os.close(fd)
        secs = time.monotonic() - t0
        for i, (src, dest) in enumerate(batch):
            if i in done:
                copied += bool(done[i]["ok"])
                notes.extend(done[i]["notes"])
                continue
            notes.append(f"{src}: job output not read: " + (
                f"cannot read it ({why})" if why else
                f"timed out after {secs:.0f} s" if timed_out else "the reader failed"))
        for i, (src, dest) in enumerate(batch):
            if not (done.get(i) or {}).get("ok"):
                try:
                    os.unlink(dest)
                except OSError:
                    pass
    return copied


kv = slurm_state.parse_kv

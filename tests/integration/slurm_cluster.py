"""Single-machine *real* Slurm cluster for integration tests.

One munged, one slurmctld and N slurmd (Slurm's "multiple slurmd" mode,
``slurmd -N nodeNN``) run as background processes of the test process, all
with their own config, state, spool, logs, ports and munge socket in a
fresh ``/tmp/sattrib-slurm-XXXX`` directory.  Nothing in /etc is used, no
systemd is needed.  Install the packages first with
``tests/integration/setup-system.sh`` (as root).

Quick use::

    from slurm_cluster import SlurmCluster
    with SlurmCluster(epilog="/abs/epilog.sh", epilog_slurmctld="/abs/ectld.sh",
                      node_env={"node01": {"SATTRIB_JOURNAL_DIR": "/j/node01"}},
                      node_path_prefix={"node01": "/fake/bin1"}) as c:
        jid = c.sbatch("srun hostname\n", nodes=4)           # -> int
        info = c.wait_job(jid, {"COMPLETED"}, timeout=60)     # scontrol show job -o, parsed
        c.stop_slurmd("node03"); c.wait_job(jid2, "NODE_FAIL")
        c.start_slurmd("node03"); c.resume_node("node03")
        c.run(["squeue"]).stdout; c.env  # env with SLURM_CONF for own subprocesses

pytest: conftest.py provides ``slurm_cluster_factory`` (function scope) and
``slurm_cluster_factory_module`` (module scope) fixtures and the ``slurm``
marker.

Findings (measured on the Debian 12 dev VM, 2 cores, Dec 2026)
================================================================

Versions: slurm-wlm 22.05.8 (Debian 22.05.8-4+deb12u3), munge 0.5.15,
systemd 252.  ``sinfo --version`` fails without a config (it tries configless
DNS SRV lookup first) -- use ``slurmd -V``.

Timings: setup-system.sh ~16 s on a machine without the packages, ~0.1 s when
installed.  Cluster start (munged + slurmctld + 4 slurmd, until sinfo shows
4x idle) 0.7-0.8 s; stop 0.1-0.2 s.  Submit -> COMPLETED of a trivial 4-node
job ~1 s with SchedulerParameters=batch_sched_delay=0 (the default here; ~3 s
without it), the first job after start ~2.5 s.  bf_interval=1 (default here)
lets a requeued job whose BeginTime passed start within ~1 s instead of
waiting for the 30 s backfill cycle (seen with RequeueExit: 27 s -> 8 s).
Killed slurmd -> NODE_FAIL: 15-18 s with SlurmdTimeout=10 (slurmctld pings
every SlurmdTimeout/3).  test_cluster_smoke.py: ~36 s in all (6 runs).

Machine facts / gotchas:

* PID 1 is not systemd (firecracker ``process_api``); the Debian postinst
  scripts try ``invoke-rc.d start`` -- setup-system.sh installs a temporary
  policy-rc.d (exit 101) so nothing is started and nothing fails.
* Multiple slurmd per host works with the Debian build (``slurmd -N``); each
  node has its own ``Port=``; SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile use
  ``%n``.  All nodes are ``NodeHostname=localhost NodeAddr=127.0.0.1`` and
  ``SlurmctldHost=localhost(127.0.0.1)`` (slurmctld accepts "localhost" as its
  own name), so the machine's hostname and DNS do not matter.  ``srun
  hostname`` prints the real hostname on every "node"; use $SLURMD_NODENAME.
* Ports: all picked free (bind to port 0) per cluster; if a daemon loses the
  race (``Address already in use``) start() retries with new ports.
  A clashing slurmctld port costs ~10 s (slurmctld retries its bind).
* munged: own key (1024 random bytes) and socket in the cluster dir;
  slurm.conf ``AuthInfo=socket=...`` points auth/munge and cred/munge at it.
  As root it needs ``--force``; the socket's directory must be
  world-executable; in ``-F`` mode it logs to stderr (log/munged.out), the
  --log-file is never created.  /etc/munge/munge.key is not used.
* Harmless log noise: "mpi/pmix_v4 ... can not load PMIx library" (libpmix is
  not installed, MpiDefault=none), "Could not open job state file" on a fresh
  StateSaveLocation.
* No cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
  JobAcctGatherType=jobacct_gather/none; no cgroup.conf is needed.
  Nodes are CPUs=2 RealMemory=1000 with SlurmdParameters=config_overrides, so
  the real hardware does not matter; select/cons_tres + CR_CPU lets two jobs
  share a node.
* SlurmUser=root by default; ``slurm_user="slurm"`` works too (the state, run
  and log dirs are chown'ed); then PrologSlurmctld/EpilogSlurmctld run as
  uid slurm (64030) and must be able to write wherever they write.
* sacct does NOT work: AccountingStorageType=accounting_storage/none ->
  ``sacct`` exits 1 with "Slurm accounting storage is disabled" (a slurmdbd
  with MariaDB would be needed).  ``jobcomp_file=True`` enables
  jobcomp/filetxt (log/jobcomp.txt, ``jobcomp_records()``): one line per job
  *run* with JobState=COMPLETED/FAILED/CANCELLED/NODE_FAIL, ExitCode etc.
* Race in tests: JobState=RUNNING only means the batch script started; an
  ``srun`` step may still be launching.  Killing a slurmd during the step
  launch makes srun fail (exit 233 / SIGPIPE 141) and the job ends FAILED, not
  NODE_FAIL.  Wait until the tasks really run (e.g. each task touches a file)
  before stop_slurmd()/crash_node().
* stop_slurmd() SIGKILLs only slurmd: its slurmstepd's and the job's
  processes survive (as with a crashed slurmd).  crash_node() kills them too
  (found through /proc/*/environ: everything the harness starts, including
  job processes submitted with ``c.env``, carries SATTRIB_SLURM_HARNESS_DIR).
  The same marker lets start() kill daemons left behind by a crashed
  previous run (owner pid in <dir>/owner.pid is dead).  Clusters of other
  live processes are left alone.

Prolog/Epilog environment (Slurm 22.05):

* slurmd does NOT pass its own environment to Prolog/Epilog: no PATH (!),
  no HOME, no custom variables.  /bin/sh scripts still find /usr/bin tools
  through the shell's built-in default path; Python's subprocess without
  PATH searches only os.defpath ("/bin:/usr/bin").  Same for
  PrologSlurmctld/EpilogSlurmctld (which also get no SLURM_CONF).
* Therefore per-node settings are delivered by key $SLURMD_NODENAME (which
  *is* in the Epilog env): with ``wrap_scripts=True`` (default) the harness
  configures ``Epilog=<dir>/wrappers/epilog.sh`` which sources
  ``<dir>/nodeenv/$SLURMD_NODENAME.sh`` (node_env + node_path_prefix) and
  then execs the real script.  The *Slurmctld scripts' wrapper sources
  ``nodeenv/slurmctld.sh`` (ctld_env + SLURM_CONF, since scontrol would
  otherwise look for /etc/slurm/slurm.conf).  The slurmd processes are
  started with node_env/PATH prefix too, but that only reaches slurmstepd;
  job tasks (batch script, srun tasks) get the submitter's environment
  (verified: ``srun printenv VAR`` on that node does not see it).
* Epilog (slurmd) variables: SLURMD_NODENAME SLURM_CLUSTER_NAME SLURM_CONF
  SLURM_JOBID SLURM_JOB_ID SLURM_JOB_COMMENT(if set) SLURM_JOB_CPUS_PER_NODE
  SLURM_JOB_DERIVED_EC SLURM_JOB_EXIT_CODE SLURM_JOB_EXIT_CODE2 SLURM_JOB_GID
  SLURM_JOB_NUM_NODES SLURM_JOB_PARTITION SLURM_JOB_RESTART_COUNT
  SLURM_JOB_STDIN SLURM_JOB_STDOUT SLURM_JOB_UID SLURM_JOB_USER
  SLURM_JOB_WORK_DIR SLURM_NODELIST SLURM_SCRIPT_CONTEXT=epilog_slurmd
  SLURM_UID PWD(=slurmd's cwd).  NOT SLURM_JOB_NODELIST, not SLURM_JOB_NAME.
* EpilogSlurmctld variables: same job vars minus SLURMD_NODENAME/SLURM_CONF/
  SLURM_NODELIST/SLURM_UID, plus SLURM_JOB_NODELIST SLURM_JOB_NAME
  SLURM_JOB_ACCOUNT SLURM_JOB_GROUP, SLURM_SCRIPT_CONTEXT=epilog_slurmctld.
  It does see SLURM_JOB_EXIT_CODE (raw wait() status: exit 3 -> 768),
  SLURM_JOB_EXIT_CODE2 ("3:0") and SLURM_JOB_DERIVED_EC (highest step exit
  code).  There is NO SLURM_JOB_STATE (or similar) in 22.05.
* ``scontrol show job -d <id>`` works inside EpilogSlurmctld; the job shows
  JobState=COMPLETING with the final Reason (e.g. NonZeroExitCode) and
  ExitCode.  After the end it is visible for MinJobAge (default 300 s here;
  with MinJobAge=2 it was gone ~2 s after the end, MinJobAge=10 -> ~12 s;
  then ``slurm_load_jobs error: Invalid job id specified``, rc 1).
* NODE_FAIL with JobRequeue=0 (harness default) or ``--no-requeue``: the job
  ends in NODE_FAIL, Reason=NodeDown, ExitCode=0:15.  Its EpilogSlurmctld gets
  SLURM_JOB_EXIT_CODE=0, EXIT_CODE2=0:0 (nothing in the env tells about the
  failure!) and SLURM_JOB_NODELIST with all nodes, while scontrol inside it
  shows JobState=COMPLETING Reason=NodeDown and NodeList *without* the dead
  node.  Careful: during COMPLETING scontrol's NodeList/NumNodes are the nodes
  *still completing* -- the dead node is dropped at once, the others as their
  Epilog finishes, so its value inside EpilogSlurmctld is racy (seen:
  node[01-02,04] and just node01).  Use SLURM_JOB_NODELIST for the
  allocation.  The Epilog runs at once on the surviving nodes and on the
  dead node when its slurmd comes back (also after crash_node()).
* NODE_FAIL with requeue (Slurm default JobRequeue=1, or ``--requeue``): the
  job never shows NODE_FAIL in scontrol; it goes back to PENDING with
  Reason=BeginTime, Restarts=1, SubmitTime reset, EligibleTime = now +
  cred_expire + 1 (AuthInfo cred_expire, default 120 s -> requeued jobs
  wait 2 minutes; ``cred_expire=5`` shortens it).  Its EpilogSlurmctld for
  the failed run sees SLURM_JOB_RESTART_COUNT=0, EXIT_CODE=0, and scontrol
  shows JobState=COMPLETING Reason=None Restarts=1 EndTime=Unknown and a
  NodeList without the dead node (racy, see above) -- the only hints of a
  node failure (Restarts > SLURM_JOB_RESTART_COUNT).
  jobcomp/filetxt records that run as JobState=NODE_FAIL.
* RequeueExit=<code> (``requeue_exit=``) requeues a job exiting with that
  code: PENDING Reason=BeginTime Restarts=1, the re-run sees
  SLURM_RESTART_COUNT=1 and overwrites its --output file.
* PrologFlags=Alloc works; PrologFlags=Contain would need proctrack/cgroup,
  which this harness does not use.
* ``extra_conf`` lines override generated lines with the same key.
* ``topology=`` (the text of a topology.conf) writes it beside slurm.conf and sets
  TopologyPlugin=topology/tree; ``scontrol show topology`` then answers from it, with
  Level= and each spine's Nodes= (22.05).
* ReturnToService=2: a restarted slurmd makes its DOWN node idle again
  without ``scontrol update State=RESUME``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

HARNESS_MARKER_VAR = "SATTRIB_SLURM_HARNESS_DIR"
DIR_PREFIX = "sattrib-slurm-"

SLURMCTLD = shutil.which("slurmctld", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/slurmd"
MUNGED = shutil.which("munged", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/munged"

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "NODE_FAIL",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)


class SlurmClusterError(RuntimeError):
    pass


_PORT_CLASH = re.compile(r"Address already in use|Unable to bind|bind\(\) failed|Error binding", re.I)


def slurm_available() -> bool:
    """True if the Slurm + munge binaries are installed (see setup-system.sh)."""
    return all(os.path.exists(p) for p in (SLURMCTLD, SLURMD, MUNGED)) and bool(
        shutil.which("sbatch")
    )


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    """Return n distinct currently-free TCP ports on 127.0.0.1.

    Sockets are kept open until all ports are chosen so we never get the same
    port twice; there is an unavoidable small race after closing them.
    """
    socks = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            ports.append(port)
        return ports
    finally:
        for s in socks:
            s.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _procs_with_marker(marker_value: str | None = None) -> dict[int, str]:
    """pid -> marker value for every process carrying HARNESS_MARKER_VAR."""
    found = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        val = _read_environ(pid).get(HARNESS_MARKER_VAR)
        if val is None:
            continue
        if marker_value is None or val == marker_value:
            found[pid] = val
    return found


def _kill_pids(pids: Iterable[int], grace: float = 3.0) -> None:
    pids = [p for p in pids if _pid_alive(p)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if _pid_alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)


def cleanup_stale_clusters(base: str | os.PathLike | None = None) -> list[int]:
    """Kill daemons (and their job processes) left over by crashed runs.

    A cluster directory records the pid of the process that owns it in
    ``owner.pid``.  Processes that carry our marker env var pointing to a
    directory whose owner is dead (or whose directory is gone) are killed.
    Clusters of live owners (e.g. parallel pytest workers) are left alone.
    Returns the killed pids.
    """
    victims = []
    for pid, d in _procs_with_marker().items():
        owner_file = Path(d) / "owner.pid"
        owner_alive = False
        try:
            owner_alive = _pid_alive(int(owner_file.read_text().strip()))
        except (OSError, ValueError):
            owner_alive = False
        if not owner_alive:
            victims.append(pid)
    _kill_pids(victims, grace=2.0)
    base = Path(base or tempfile.gettempdir())
    # remove directories of dead owners
    for d in base.glob(DIR_PREFIX + "*"):
        try:
            owner = int((d / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            owner = None
        if owner is None or not _pid_alive(owner):
            if (d / "keep").exists():
                continue
            shutil.rmtree(d, ignore_errors=True)
    return victims


def parse_scontrol_oneliner(line: str) -> dict[str, str]:
    """Parse one record of ``scontrol show <thing> -o`` into a dict.

    Values may contain spaces (Command=, Reason=, Comment=) and '='
    (TRES=cpu=1,...).  A new key starts at a space followed by
    ``Key=`` where Key is made of ``[A-Za-z0-9_:/]``.
    """
    line = line.strip()
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.\[\]]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_:/.\[\]]*=|$)", line):
        out[m.group(1)] = m.group(2).strip()
    return out


def tail(path: str | os.PathLike, n: int = 40) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(lines[-n:])


# ---------------------------------------------------------------------------
# the cluster
# ---------------------------------------------------------------------------


class SlurmCluster:
    """A real slurmctld + N slurmd (multiple-slurmd mode) on this host.

    Use as a context manager::

        with SlurmCluster(epilog="/path/epilog.sh") as c:
            jid = c.sbatch("#!/bin/sh\\nsrun hostname\\n", nodes=4)
            info = c.wait_job(jid, {"COMPLETED"}, timeout=60)
    """

    def __init__(
        self,
        nodes: int | Sequence[str] = 4,
        *,
        cluster_name: str = "sattribtest",
        partition: str = "debug",
        cpus_per_node: int = 2,
        real_memory_mb: int = 1000,
        select_type: str = "select/cons_tres",
        select_type_parameters: str | None = "CR_CPU",
        scheduler_parameters: str | None = "batch_sched_delay=0,bf_interval=1",
        prolog: str | None = None,
        epilog: str | None = None,
        prolog_slurmctld: str | None = None,
        epilog_slurmctld: str | None = None,
        prolog_flags: str | None = None,
        epilog_msg_time: int | None = None,
        job_requeue: bool | None = False,
        requeue_exit: str | None = None,
        cred_expire: int | None = None,
        slurm_user: str = "root",
        jobcomp_file: bool = False,
        slurmd_timeout: int = 10,
        message_timeout: int = 5,
        kill_wait: int = 2,
        min_job_age: int = 300,
        return_to_service: int = 2,
        debug_level: str = "debug",
        extra_conf: str | Sequence[str] = (),
        node_env: Mapping[str, Mapping[str, str]] | None = None,
        node_path_prefix: Mapping[str, str | Sequence[str]] | None = None,
        ctld_env: Mapping[str, str] | None = None,
        wrap_scripts: bool = True,
        base_dir: str | os.PathLike | None = None,
        keep_dir: bool | None = None,
        start_timeout: float = 60.0,
        cleanup_stale: bool = True,
        own_hostnames: bool = False,
        topology: str | None = None,
    ) -> None:
        if isinstance(nodes, int):
            self.nodes = [f"node{i:02d}" for i in range(1, nodes + 1)]
        else:
            self.nodes = list(nodes)
        self.cluster_name = cluster_name
        self.partition = partition
        self.cpus_per_node = cpus_per_node
        self.real_memory_mb = real_memory_mb
        self.select_type = select_type
        self.select_type_parameters = select_type_parameters
        self.scheduler_parameters = scheduler_parameters
        self.prolog = prolog
        self.epilog = epilog
        self.prolog_slurmctld = prolog_slurmctld
        self.epilog_slurmctld = epilog_slurmctld
        self.prolog_flags = prolog_flags
        self.epilog_msg_time = epilog_msg_time
        self.job_requeue = job_requeue
        self.requeue_exit = requeue_exit
        self.cred_expire = cred_expire
        self.slurm_user = slurm_user
        self.jobcomp_file = jobcomp_file
        self.slurmd_timeout = slurmd_timeout
        self.message_timeout = message_timeout
        self.kill_wait = kill_wait
        self.min_job_age = min_job_age
        self.return_to_service = return_to_service
        self.debug_level = debug_level
        self.extra_conf = [extra_conf] if isinstance(extra_conf, str) else list(extra_conf)
        self.node_env = {n: dict(v) for n, v in (node_env or {}).items()}
        self.node_path_prefix = {
            n: ([v] if isinstance(v, str) else list(v)) for n, v in (node_path_prefix or {}).items()
        }
        self.ctld_env = dict(ctld_env or {})
        self.wrap_scripts = wrap_scripts
        self.base_dir = base_dir
        # SATTRIB_SLURM_KEEP=1 keeps every cluster directory (logs!) for debugging
        self.keep_dir = keep_dir if keep_dir is not None else os.environ.get("SATTRIB_SLURM_KEEP") == "1"
        self.start_timeout = start_timeout
        self.cleanup_stale = cleanup_stale
        # Each slurmd (and so its jobs and Epilogs) in its own UTS namespace whose host name
        # is the node's name: `%N` in an output pattern then names a file per node.
        self.own_hostnames = own_hostnames
        # A topology.conf (its text) beside slurm.conf, with TopologyPlugin=topology/tree.
        self.topology = topology
        for n in list(self.node_env) + list(self.node_path_prefix):
            if n not in self.nodes:
                raise ValueError(f"unknown node {n!r} (nodes: {self.nodes})")

        self.dir: Path | None = None
        self.conf_path: Path | None = None
        self.ctld_port: int | None = None
        self.node_ports: dict[str, int] = {}
        self._munged: subprocess.Popen | None = None
        self._ctld: subprocess.Popen | None = None
        self._slurmd: dict[str, subprocess.Popen] = {}
        self.start_seconds: float | None = None

    # -- paths -------------------------------------------------------------
    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.sock"

    @property
    def jobcomp_path(self) -> Path:
        return self.dir / "log" / "jobcomp.txt"

    @property
    def ctld_log(self) -> Path:
        return self.dir / "log" / "slurmctld.log"

    def slurmd_log(self, node: str) -> Path:
        return self.dir / "log" / f"slurmd.{node}.log"

    def node_env_file(self, node: str) -> Path:
        """Shell file (``export K=V`` lines) with the per-node environment.

        Sourced by the generated Prolog/Epilog wrappers, keyed by
        $SLURMD_NODENAME, because slurmd does NOT pass its own environment to
        Prolog/Epilog.  Scripts not using the wrappers can source it
        themselves: ``$HARNESS_DIR/nodeenv/$SLURMD_NODENAME.sh``.
        """
        return self.dir / "nodeenv" / f"{node}.sh"

    # -- environment ---------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Environment for running Slurm client commands against this cluster."""
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("SLURM_") or k.startswith("SBATCH_") or k.startswith("SRUN_") or k.startswith("SALLOC_"):
                del env[k]
        env["SLURM_CONF"] = str(self.conf_path)
        env[HARNESS_MARKER_VAR] = str(self.dir)
        return env

    def _node_full_env(self, node: str) -> dict[str, str]:
        extra = dict(self.node_env.get(node, {}))
        prefix = self.node_path_prefix.get(node)
        if prefix:
            base_path = extra.get("PATH", os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
            extra["PATH"] = ":".join([*prefix, base_path])
        return extra

    def _daemon_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = self.env
        env.update(extra or {})
        return env

    # -- config generation ---------------------------------------------------
    def _write_wrapper(self, kind: str, target: str, per_node: bool) -> str:
        """Write a wrapper that sources the per-node env file then execs target."""
        w = self.dir / "wrappers" / f"{kind}.sh"
        if per_node:
            src = (
                f'__f="{self.dir}/nodeenv/${{SLURMD_NODENAME:-none}}.sh"\n'
                '[ -r "$__f" ] && . "$__f"\nunset __f\n'
            )
        else:
            src = f'[ -r "{self.dir}/nodeenv/slurmctld.sh" ] && . "{self.dir}/nodeenv/slurmctld.sh"\n'
        w.write_text(
            "#!/bin/sh\n"
            f"# generated by slurm_cluster.py: {kind} wrapper\n"
            f"export {HARNESS_MARKER_VAR}={shlex.quote(str(self.dir))}\n"
            f"{src}"
            f"exec {shlex.quote(target)} \"$@\"\n"
        )
        w.chmod(0o755)
        return str(w)

    def _script_path(self, kind: str, target: str | None, per_node: bool) -> str | None:
        if not target:
            return None
        if not os.path.isabs(target):
            raise ValueError(f"{kind} must be an absolute path: {target!r}")
        if self.wrap_scripts:
            return self._write_wrapper(kind, target, per_node)
        return target

    def _write_env_file(self, path: Path, env: Mapping[str, str]) -> None:
        lines = ["# generated by slurm_cluster.py"]
        for k, v in env.items():
            lines.append(f"export {k}={shlex.quote(v)}")
        path.write_text("\n".join(lines) + "\n")

    def generate_config(self) -> str:
        d = self.dir
        lines = [
            f"# generated by tests/integration/slurm_cluster.py",
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}"
            + (f",cred_expire={self.cred_expire}" if self.cred_expire is not None else ""),
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd.%n.pid",
            f"SlurmctldLogFile={self.ctld_log}",
            f"SlurmdLogFile={d}/log/slurmd.%n.log",
            f"SlurmctldDebug={self.debug_level}",
            f"SlurmdDebug={self.debug_level}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            *(
                [f"JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp_path}"]
                if self.jobcomp_file
                else ["JobCompType=jobcomp/none"]
            ),
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            f"SelectType={self.select_type}",
        ]
        if self.select_type_parameters:
            lines.append(f"SelectTypeParameters={self.select_type_parameters}")
        if self.scheduler_parameters:
            lines.append(f"SchedulerParameters={self.scheduler_parameters}")
        lines += [
            "MailProg=/bin/true",
            f"SlurmdTimeout={self.slurmd_timeout}",
            "SlurmctldTimeout=30",
            f"MessageTimeout={self.message_timeout}",
            f"KillWait={self.kill_wait}",
            "InactiveLimit=0",
            "WaitTime=0",
            f"MinJobAge={self.min_job_age}",
            f"ReturnToService={self.return_to_service}",
            "SlurmdParameters=config_overrides",
            "UnkillableStepTimeout=30",
            "TreeWidth=50",
        ]
        if self.job_requeue is not None:
            lines.append(f"JobRequeue={1 if self.job_requeue else 0}")
        if self.requeue_exit:
            lines.append(f"RequeueExit={self.requeue_exit}")
        for key, kind, target, per_node in (
            ("Prolog", "prolog", self.prolog, True),
            ("Epilog", "epilog", self.epilog, True),
            ("PrologSlurmctld", "prolog_slurmctld", self.prolog_slurmctld, False),
            ("EpilogSlurmctld", "epilog_slurmctld", self.epilog_slurmctld, False),
        ):
            p = self._script_path(kind, target, per_node)
            if p:
                lines.append(f"{key}={p}")
        if self.prolog_flags:
            lines.append(f"PrologFlags={self.prolog_flags}")
        if self.epilog_msg_time is not None:
            lines.append(f"EpilogMsgTime={self.epilog_msg_time}")
        if self.topology:
            lines.append("TopologyPlugin=topology/tree")
            (self.dir / "topology.conf").write_text(self.topology)
        # extra_conf wins over generated single-key lines (slurm.conf would
        # otherwise see the key twice)
        def key(line: str) -> str:
            return line.split("=", 1)[0].strip().lower()

        overridden = {key(l) for l in self.extra_conf if "=" in l and not l.lstrip().startswith("#")}
        overridden -= {"nodename", "partitionname"}
        lines = [l for l in lines if l.startswith("#") or key(l) not in overridden]
        lines += self.extra_conf
        for n in self.nodes:
            lines.append(
                f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 "
                f"Port={self.node_ports[n]} CPUs={self.cpus_per_node} "
                f"RealMemory={self.real_memory_mb} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} "
            "Default=YES MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> "SlurmCluster":
        """Start munged, slurmctld and all slurmd; wait until all nodes are idle.

        Retries with fresh ports if a daemon lost the race for its port.
        """
        for i in range(attempts):
            try:
                return self._start_once()
            except SlurmClusterError as e:
                if i + 1 < attempts and _PORT_CLASH.search(str(e)):
                    continue
                raise
        raise AssertionError("unreachable")

    def _start_once(self) -> "SlurmCluster":
        if os.geteuid() != 0:
            raise SlurmClusterError("SlurmCluster needs root (slurmd must run as root)")
        if not slurm_available():
            raise SlurmClusterError(
                "slurm/munge not installed: run tests/integration/setup-system.sh"
            )
        t0 = time.monotonic()
        base = Path(self.base_dir or tempfile.gettempdir())
        if self.cleanup_stale:
            cleanup_stale_clusters(base)
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base))
        # munged refuses sockets in dirs that are not world-executable
        self.dir.chmod(0o755)
        (self.dir / "owner.pid").write_text(f"{os.getpid()}\n")
        if self.keep_dir:
            (self.dir / "keep").touch()
        for sub in ("state", "run", "log", "munge", "wrappers", "nodeenv", "spool"):
            (self.dir / sub).mkdir()
        for n in self.nodes:
            (self.dir / "spool" / n).mkdir(mode=0o755)
        ports = _free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:]))

        self.conf_path = self.dir / "slurm.conf"
        for n in self.nodes:
            self._write_env_file(self.node_env_file(n), self._node_full_env(n))
        # EpilogSlurmctld/PrologSlurmctld get neither SLURM_CONF nor PATH from
        # slurmctld; on a real cluster scontrol finds /etc/slurm/slurm.conf by
        # default, here the wrapper has to point it at our config.
        self._write_env_file(
            self.dir / "nodeenv" / "slurmctld.sh", {"SLURM_CONF": str(self.conf_path), **self.ctld_env}
        )

        self.conf_path.write_text(self.generate_config())
        if self.slurm_user != "root":
            # slurmctld drops privileges to SlurmUser: it must own its state
            # dir, pid dir and log files.
            import pwd

            pw = pwd.getpwnam(self.slurm_user)
            for sub in ("state", "run", "log"):
                os.chown(self.dir / sub, pw.pw_uid, pw.pw_gid)

        try:
            self._start_munged()
            self._start_ctld()
            for n in self.nodes:
                self.start_slurmd(n, wait=False)
            self.wait_nodes(self.nodes, {"IDLE"}, timeout=self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _popen(self, argv: list[str], logname: str, env: Mapping[str, str]) -> subprocess.Popen:
        out = open(self.dir / "log" / logname, "ab")
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=str(self.dir),
                start_new_session=True,
            )
        finally:
            out.close()

    def _start_munged(self) -> None:
        mdir = self.dir / "munge"
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        mdir.chmod(0o755)
        argv = [
            MUNGED,
            "-F",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={mdir / 'munged.log'}",
            f"--pid-file={mdir / 'munged.pid'}",
            f"--seed-file={mdir / 'munged.seed'}",
            "--num-threads=4",
        ]
        self._munged = self._popen(argv, "munged.out", self._daemon_env())
        self._wait_for(
            lambda: self.munge_socket.exists(),
            10,
            "munged socket",
            proc=self._munged,
            log=self.dir / "log" / "munged.out",
        )

    def _start_ctld(self) -> None:
        argv = [SLURMCTLD, "-D", "-i", "-f", str(self.conf_path)]
        env = self._daemon_env(self.ctld_env)
        self._ctld = self._popen(argv, "slurmctld.out", env)

        def ready() -> bool:
            r = subprocess.run(
                ["scontrol", "ping"], env=self.env, capture_output=True, text=True, timeout=15
            )
            return "UP" in r.stdout

        self._wait_for(ready, 30, "slurmctld to answer ping", proc=self._ctld, log=self.ctld_log)

    def start_slurmd(self, node: str, wait: bool = True, timeout: float = 30) -> None:
        """(Re)start slurmd for ``node``; with wait=True wait until it answers."""
        old = self._slurmd.get(node)
        if old is not None and old.poll() is None:
            raise SlurmClusterError(f"slurmd for {node} is already running (pid {old.pid})")
        env = self._daemon_env(self._node_full_env(node))
        env["SLURMD_NODENAME"] = node
        argv = [SLURMD, "-D", "-N", node, "-f", str(self.conf_path)]
        if self.own_hostnames:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', node] + argv
        self._slurmd[node] = self._popen(argv, f"slurmd.{node}.out", env)
        if wait:
            self._wait_for(
                lambda: self._slurmd_registered(node),
                timeout,
                f"slurmd {node} to register",
                proc=self._slurmd[node],
                log=self.slurmd_log(node),
            )

    def _slurmd_registered(self, node: str) -> bool:
        r = subprocess.run(
            ["scontrol", "show", "node", node, "-o"], env=self.env, capture_output=True, text=True
        )
        info = parse_scontrol_oneliner(r.stdout)
        state = info.get("State", "")
        return bool(state) and "NOT_RESPONDING" not in state and not state.startswith(("DOWN", "UNKNOWN"))

    def slurmd_pid(self, node: str) -> int | None:
        p = self._slurmd.get(node)
        return p.pid if p is not None and p.poll() is None else None

    def stop_slurmd(self, node: str, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
        """Stop the slurmd of ``node`` (default SIGKILL: simulates a dead node daemon).

        Only the slurmd process is signalled; its slurmstepd's (and thus
        running job processes) keep running, as on a real node whose slurmd
        crashed.  Use stop_node() to also kill them.
        """
        p = self._slurmd.get(node)
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(5)

    def node_processes(self, node: str) -> list[int]:
        """pids of slurmd, slurmstepd's and job processes belonging to ``node``.

        Found via /proc/<pid>/environ: all of them carry our marker variable and
        SLURMD_NODENAME=<node> (slurmstepd inherits slurmd's environment; job
        tasks get SLURMD_NODENAME from Slurm).
        """
        pids = []
        for pid in _procs_with_marker(str(self.dir)):
            if _read_environ(pid).get("SLURMD_NODENAME") == node:
                pids.append(pid)
        return pids

    def crash_node(self, node: str) -> list[int]:
        """Simulate a node crash: SIGKILL slurmd *and* its stepd/job processes.

        Returns the killed pids.  The Epilog does not run (as on a real
        crash); restart with start_slurmd().
        """
        self.stop_slurmd(node, signal.SIGKILL)
        pids = self.node_processes(node)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return pids

    def reconfigure(self, **changes) -> None:
        """Change constructor attributes (e.g. epilog=..., extra_conf=[...]),
        rewrite slurm.conf and run ``scontrol reconfigure``.

        Node list, ports and paths stay the same.  Per-node env changes
        (node_env/node_path_prefix) are rewritten into the nodeenv files
        (seen by wrapped Prolog/Epilog at once) but a running slurmd keeps its
        process environment until restarted.
        """
        for k, v in changes.items():
            if not hasattr(self, k) or k in ("nodes", "dir", "conf_path"):
                raise AttributeError(f"cannot reconfigure {k!r}")
            if k == "extra_conf" and isinstance(v, str):
                v = [v]
            setattr(self, k, v)
        for n in self.nodes:
            self._write_env_file(self.node_env_file(n), self._node_full_env(n))
        self._write_env_file(
            self.dir / "nodeenv" / "slurmctld.sh", {"SLURM_CONF": str(self.conf_path), **self.ctld_env}
        )
        self.conf_path.write_text(self.generate_config())
        self.run(["scontrol", "reconfigure"])

    def stop(self) -> None:
        """Stop everything. Safe to call multiple times and after partial starts."""
        if self.dir is None:
            return
        procs = [p for p in self._slurmd.values() if p is not None]
        procs += [p for p in (self._ctld, self._munged) if p is not None]
        # polite shutdown: SIGTERM to the process groups
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        # slurmstepd's and job processes escape the daemons' process groups;
        # they all inherit our marker variable, so find them by it.
        _kill_pids(_procs_with_marker(str(self.dir)).keys(), grace=2.0)
        self._slurmd.clear()
        self._ctld = self._munged = None
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                (self.dir / "owner.pid").unlink()

    # -- waiting / diagnostics ---------------------------------------------------
    def _wait_for(self, pred, timeout: float, what: str, proc=None, log=None, interval=0.2):
        deadline = time.monotonic() + timeout
        while True:
            if proc is not None and proc.poll() is not None:
                raise SlurmClusterError(
                    f"process {proc.args[0]} exited with {proc.returncode} while waiting for {what}\n"
                    + (f"--- {log} ---\n{tail(log)}\n" if log else "")
                    + self.diagnostics()
                )
            try:
                if pred():
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"timeout ({timeout}s) waiting for {what}\n"
                    + (f"--- {log} ---\n{tail(log)}\n" if log else "")
                    + self.diagnostics()
                )
            time.sleep(interval)

    def diagnostics(self, n: int = 25) -> str:
        if self.dir is None:
            return ""
        parts = []
        dead = {n: p.returncode for n, p in self._slurmd.items() if p.poll() is not None}
        for name, p in (("slurmctld", self._ctld), ("munged", self._munged)):
            if p is not None and p.poll() is not None:
                dead[name] = p.returncode
        if dead:
            parts.append(f"--- daemons that exited (name: returncode): {dead}")
        for f in sorted((self.dir / "log").glob("*")):
            parts.append(f"--- {f.name} (last {n} lines) ---\n{tail(f, n)}")
        mlog = self.dir / "munge" / "munged.log"
        if mlog.exists():
            parts.append(f"--- munged.log ---\n{tail(mlog, n)}")
        with contextlib.suppress(Exception):
            r = subprocess.run(
                ["sinfo", "-N", "-o", "%N %T %E"], env=self.env, capture_output=True, text=True, timeout=10
            )
            parts.append(f"--- sinfo ---\n{r.stdout}{r.stderr}")
        return "\n".join(parts)

    # -- client helpers -------------------------------------------------------------
    def run(
        self, cmd: str | Sequence[str], check: bool = True, timeout: float = 60, **kw
    ) -> subprocess.CompletedProcess:
        """Run a command with the cluster's environment; returns CompletedProcess (text)."""
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        env = self.env
        env.update(kw.pop("env", {}) or {})
        r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise SlurmClusterError(
                f"command {cmd} failed with {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
            )
        return r

    def sbatch(self, script: str, *args: str, workdir: str | os.PathLike | None = None, **opts) -> int:
        """Submit ``script`` (text) and return the job id.

        keyword options become long options: nodes=4 -> --nodes=4,
        no_requeue=True -> --no-requeue, output="x" -> --output=x.
        Default --output is <dir>/jobs/slurm-%j.out.
        """
        jobs = self.dir / "jobs"
        jobs.mkdir(exist_ok=True)
        if not script.startswith("#!"):
            script = "#!/bin/sh\n" + script
        opts.setdefault("output", str(jobs / "slurm-%j.out"))
        argv = ["sbatch", "--parsable"]
        for k, v in opts.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                argv.append(flag)
            elif v is False or v is None:
                continue
            else:
                argv.append(f"{flag}={v}")
        argv += list(args)
        r = self.run(argv, input=script, cwd=str(workdir or jobs))
        return int(r.stdout.strip().split(";")[0])

    def job(self, jobid: int | str, detail: bool = False) -> dict[str, str] | None:
        """``scontrol show job -o [-d]`` parsed into a dict, None if unknown."""
        argv = ["scontrol", "show", "job", "-o"]
        if detail:
            argv.append("-d")
        argv.append(str(jobid))
        r = self.run(argv, check=False)
        if r.returncode != 0 or not r.stdout.strip():
            return None
        return parse_scontrol_oneliner(r.stdout.splitlines()[0])

    def job_state(self, jobid: int | str) -> str | None:
        j = self.job(jobid)
        return j.get("JobState") if j else None

    def wait_job(
        self,
        jobid: int | str,
        states: str | Iterable[str] = TERMINAL_STATES,
        timeout: float = 60,
        interval: float = 0.25,
    ) -> dict[str, str]:
        """Wait until JobState is in ``states``; returns the parsed job record.

        Raises SlurmClusterError on timeout, or if the job reaches a terminal
        state not in ``states``.
        """
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        last = None
        while True:
            j = self.job(jobid)
            last = j
            st = j.get("JobState") if j else None
            if st in states:
                return j
            if st in TERMINAL_STATES and not (states - TERMINAL_STATES) and st not in states:
                raise SlurmClusterError(
                    f"job {jobid} ended in {st}, expected {sorted(states)}: {j}\n" + self.diagnostics()
                )
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"timeout ({timeout}s) waiting for job {jobid} to reach {sorted(states)}; last: {last}\n"
                    + self.diagnostics()
                )
            time.sleep(interval)

    def node(self, node: str) -> dict[str, str]:
        r = self.run(["scontrol", "show", "node", "-o", node])
        return parse_scontrol_oneliner(r.stdout)

    def node_state(self, node: str) -> str:
        """Full State string, e.g. 'IDLE', 'DOWN*', 'IDLE+DRAIN', 'ALLOCATED'."""
        return self.node(node).get("State", "")

    def node_states(self) -> dict[str, str]:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        out = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out[parts[0]] = parts[1]
        return out

    def wait_nodes(
        self, nodes: Iterable[str], states: Iterable[str], timeout: float = 60, interval: float = 0.25
    ) -> dict[str, str]:
        """Wait until each node's ``sinfo %T`` state (lower-cased compare) is in states."""
        nodes = list(nodes)
        want = {s.lower() for s in states}
        cur: dict[str, str] = {}

        def ok() -> bool:
            nonlocal cur
            cur = self.node_states()
            return all(cur.get(n, "").lower() in want for n in nodes)

        procs = {}
        deadline = time.monotonic() + timeout
        while not ok():
            for n in nodes:
                p = self._slurmd.get(n)
                if p is not None and p.poll() is not None:
                    procs[n] = p.returncode
            if self._ctld is not None and self._ctld.poll() is not None:
                raise SlurmClusterError(
                    f"slurmctld exited ({self._ctld.returncode})\n" + self.diagnostics()
                )
            if procs:
                raise SlurmClusterError(f"slurmd exited: {procs}\n" + self.diagnostics())
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"timeout ({timeout}s) waiting for nodes {nodes} in {sorted(want)}; now {cur}\n"
                    + self.diagnostics()
                )
            time.sleep(interval)
        return cur

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a Slurm hostlist ('node[01-02,04]') via scontrol show hostnames."""
        if not hostlist or hostlist == "(null)":
            return []
        return self.run(["scontrol", "show", "hostnames", hostlist]).stdout.split()

    def resume_node(self, node: str) -> None:
        self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def set_node_state(self, node: str, state: str, reason: str | None = None) -> None:
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        if reason:
            argv.append(f"Reason={reason}")
        self.run(argv)

    def scancel(self, jobid: int | str, *args: str) -> None:
        self.run(["scancel", *args, str(jobid)])

    def jobcomp_records(self) -> list[dict[str, str]]:
        """Parsed lines of the jobcomp/filetxt log (needs jobcomp_file=True).

        One record per job *run*: a job requeued after NODE_FAIL gets a
        record with JobState=NODE_FAIL for the failed run.
        """
        if not self.jobcomp_file:
            raise SlurmClusterError("jobcomp_file=False: no job completion log")
        try:
            text = self.jobcomp_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [parse_scontrol_oneliner(line) for line in text.splitlines() if line.strip()]

    def job_output(self, jobid: int | str) -> str:
        p = self.dir / "jobs" / f"slurm-{jobid}.out"
        return p.read_text(errors="replace") if p.exists() else ""

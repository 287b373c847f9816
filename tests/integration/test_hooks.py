"""End-to-end tests of the installed Slurm hooks on a real single-host Slurm cluster.

sattrib is installed once per module with ``sh install.sh --prefix <tmp> --editable
--slurm-user root`` (the real wrappers, venv and config), slurm.conf's ``Epilog=`` /
``EpilogSlurmctld=`` point at the installed wrappers (through the harness wrappers, which only
source the per-node env file first), and real jobs fail in various ways.  Each node gets its own
kernel journal (the installed config's ``journal_dir`` is ``.../journal/%n``) and its own
stand-in ``nvidia-smi`` that prints a recorded ``nvidia-smi -q -x`` (the ``probe_path`` setting
in the installed config names one folder whose ``nvidia-smi`` runs the node's own by
``$SLURMD_NODENAME``). The hooks take no setting from their environment, and the installed
wrapper sets its own fixed PATH.

Measured on the 2-core dev VM (Slurm 22.05.8), five runs: install.sh --editable 33-55 s; whole
file 127-143 s (200 s while another engineer's cluster tests ran alongside).  Job end -> diagnosis stored 2.7-3.4 s (4 nodes, all snapshots in); with three
hanging nvidia-smi 4.8-6.0 s (each node Epilog 3.8-4.1 s, probe_timeout_s=3).  Epilog wrapper
run directly: successful job 1.3-2.5 ms median (shell fast path, no Python), failed job
350-680 ms median (Python, journalctl, stand-in nvidia-smi, munge).  Killed slurmd -> NODE_FAIL
18-21 s; NODE_FAIL -> diagnosis ~1 s, scancel -> diagnosis ~1 s: for both, every node Epilog
sees SLURM_JOB_EXIT_CODE2=0:0 and sends no snapshot, and the worker, seeing the same exit
status, does not wait for any.

Run (as root, ~2.5 min)::

    .venv/bin/python -m pytest tests/integration/test_hooks.py -s -m slurm

``-s`` shows the measured numbers; they are also written to
``tests/artifacts/hooks-timings.json``.  ``SATTRIB_SLURM_KEEP=1`` keeps the cluster directory
and the install prefix (logs, spool, bundles, database) for debugging.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import textwrap
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from journal import JournalEntry, journal_remote_binary, new_boot_id, write_journal
from slurm_cluster import HARNESS_MARKER_VAR, SlurmCluster, _procs_with_marker, slurm_available

REPO = Path(__file__).resolve().parents[2]
SAMPLE_XML = REPO / "tests" / "data" / "samples" / "nvidia-smi-q-x.a10g-1gpu.515.105.01.xml"
ARTIFACTS = REPO / "tests" / "artifacts"
TIMINGS_FILE = ARTIFACTS / "hooks-timings.json"

NODES = ["node01", "node02", "node03", "node04"]
# The recorded nvidia-smi output is an A10G at 00000000:00:1E.0; the kernel names it 0000:00:1e.
GPU_PCI = "0000:00:1e"
IPS = {n: f"10.40.8.{11 + i}" for i, n in enumerate(NODES)}

# Short hook timings for the tests (appended to the installed config).
COLLECT_WAIT_S = 8.0
PROBE_TIMEOUT_S = 3.0
EPILOG_BUDGET_S = 10.0
DIAGNOSIS_TIMEOUT = 60.0          # job end -> diagnosis stored, at most

KEEP = os.environ.get("SATTRIB_SLURM_KEEP") == "1"
RESULTS: dict = {}                # measured numbers, written to TIMINGS_FILE


# ---------------------------------------------------------------------------
# bounded tests (pytest-timeout is not a dependency: SIGALRM per test)
# ---------------------------------------------------------------------------


def timeout(seconds: int):
    def deco(f):
        f._hook_timeout = seconds
        return f

    return deco


@pytest.fixture(autouse=True)
def _bounded(request):
    limit = getattr(request.function, "_hook_timeout", 180)

    def on_alarm(signum, frame):
        raise TimeoutError(f"{request.node.name} exceeded its {limit}s limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def record(key: str, value) -> None:
    RESULTS[key] = value
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    old = {}
    with contextlib.suppress(OSError, ValueError):
        old = json.loads(TIMINGS_FILE.read_text())
    old.update(RESULTS)
    old["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    TIMINGS_FILE.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------
# installation
# ---------------------------------------------------------------------------


class Install:
    def __init__(self, prefix: Path):
        self.prefix = prefix
        self.config = prefix / "etc" / "sattrib.toml"
        self.epilog = prefix / "libexec" / "sattrib-epilog"
        self.epilog_ctld = prefix / "libexec" / "sattrib-epilog-slurmctld"
        self.sattrib = prefix / "bin" / "sattrib"
        self.base_config = ""
        self.base_settings: dict = {}     # test settings every configure() keeps
        self.settings: dict = {}
        self.raw_extra = ""               # appended verbatim (a deliberate typo)

    # the installed config plus a block of test settings (munge socket of the current cluster)
    def configure(self, **extra) -> None:
        ours = {
            "collect_wait_s": COLLECT_WAIT_S,
            "probe_timeout_s": PROBE_TIMEOUT_S,
            "epilog_budget_s": EPILOG_BUDGET_S,
            **self.base_settings,
            **extra,
        }
        keep = [
            line for line in self.base_config.splitlines()
            if not re.match(r"\s*(%s)\s*=" % "|".join(map(re.escape, ours)), line)
        ]
        block = ["", "# ---- appended by tests/integration/test_hooks.py ----"]
        for k, v in ours.items():
            block.append(f"{k} = {json.dumps(v)}")
        text = "\n".join(keep + block) + "\n" + self.raw_extra
        tmp = self.config.with_name(".sattrib.toml.tmp")
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, self.config)
        self.settings = tomllib.loads(text)

    @property
    def database(self) -> Path:
        return Path(self.settings["database"])

    @property
    def bundle_dir(self) -> Path:
        return Path(self.settings["bundle_dir"])

    @property
    def spool_dir(self) -> Path:
        return Path(self.settings["spool_dir"])

    @property
    def log_dir(self) -> Path:
        return Path(self.settings["log_dir"])

    def log(self, name: str) -> str:
        p = self.log_dir / name
        return p.read_text(errors="replace") if p.exists() else ""

    def logs_tail(self, n: int = 30) -> str:
        parts = []
        for name in ("epilog.log", "epilog-slurmctld.log", "worker.log"):
            lines = self.log(name).splitlines()[-n:]
            parts.append(f"--- {name} (last {n} lines) ---\n" + "\n".join(lines))
        return "\n".join(parts)


@pytest.fixture(scope="module")
def install():
    if os.geteuid() != 0:
        pytest.skip("Slurm integration tests need root (slurmd must run as root)")
    if not slurm_available():
        pytest.fail("Slurm is not installed: run `bash tests/integration/setup-system.sh`", pytrace=False)
    if journal_remote_binary() is None:
        pytest.fail("systemd-journal-remote missing: run tests/integration/setup-system.sh", pytrace=False)
    script = REPO / "install.sh"
    if not script.exists():
        pytest.fail(f"{script} does not exist", pytrace=False)
    h = subprocess.run(["sh", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert h.returncode == 0 and "--prefix" in h.stdout, f"install.sh --help: {h.stdout}{h.stderr}"

    prefix = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-inst-"))
    prefix.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATTRIB_")}
    t0 = time.monotonic()
    r = subprocess.run(
        ["sh", str(script), "--prefix", str(prefix), "--editable", "--slurm-user", "root"],
        cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600,
    )
    secs = time.monotonic() - t0
    assert r.returncode == 0, f"install.sh failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    print(f"\ninstall.sh --editable into {prefix}: {secs:.1f}s")
    record("install_seconds", round(secs, 1))
    inst = Install(prefix)
    for p in (inst.config, inst.epilog, inst.epilog_ctld, inst.sattrib):
        assert p.exists(), f"install.sh did not create {p}\n{r.stdout}"
    for w in (inst.epilog, inst.epilog_ctld):
        assert os.access(w, os.X_OK), w
    inst.base_config = inst.config.read_text()
    base = tomllib.loads(inst.base_config)
    for key in ("database", "bundle_dir", "spool_dir", "log_dir"):
        assert str(base.get(key, "")).startswith(str(prefix)), f"config {key} = {base.get(key)!r}"
    inst.configure()
    yield inst
    if not KEEP:
        shutil.rmtree(prefix, ignore_errors=True)


# ---------------------------------------------------------------------------
# per-node stand-ins: journals and nvidia-smi
# ---------------------------------------------------------------------------

# The stand-in prints the recorded `nvidia-smi -q -x` (or, after Nodes.lose_gpu, what nvidia-smi
# says of a GPU that fell off the bus); a job comment "smi-<mode>-<node>" makes it
# misbehave on that node (SLURM_JOB_COMMENT is in the Epilog's environment, and the probe inherits
# it): hang (exec sleep), noterm (ignores SIGTERM/INT/HUP), escape (a grandchild in its own
# session keeps the output pipes open after the probe killed the process group).
NVSMI = """#!/bin/sh
# stand-in nvidia-smi for {node} (tests/integration/test_hooks.py)
case " ${{SLURM_JOB_COMMENT:-}} " in
  *" smi-hang-{node} "*) exec sleep 100000 ;;
  *" smi-noterm-{node} "*) trap '' TERM INT HUP; while :; do sleep 1; done ;;
  *" smi-escape-{node} "*) trap '' TERM; setsid sleep 100000 & wait; sleep 100000 ;;
esac
if [ -e {lost} ]; then
  echo "Unable to determine the device handle for GPU0000:00:1E.0: GPU is lost.  Reboot the system to recover this GPU"
  exit 15
fi
if [ "$*" != "-q -x" ]; then
  echo "stand-in nvidia-smi: only -q -x is recorded (got: $*)" >&2
  exit 2
fi
exec cat {xml}
"""


class Nodes:
    """Journal directories and stand-in nvidia-smi directories of the four nodes."""

    def __init__(self, root: Path):
        self.root = root
        self.boot_id = new_boot_id()
        self.env: dict[str, dict[str, str]] = {}
        self.journal_pattern = str(root / "journal" / "%n")     # the config's journal_dir
        self.probe_dir = root / "bin"
        self.probe_dir.mkdir()
        smi = self.probe_dir / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\nexec {shlex.quote(str(self.probe_dir))}/"$SLURMD_NODENAME"'
                       '/nvidia-smi "$@"\n')
        smi.chmod(0o755)
        for n in NODES:
            jd = root / "journal" / n
            jd.mkdir(parents=True)
            bd = root / "bin" / n
            bd.mkdir(parents=True)
            smi = bd / "nvidia-smi"
            smi.write_text(NVSMI.format(node=n, xml=shlex.quote(str(SAMPLE_XML)),
                                        lost=shlex.quote(str(bd / "gpu-lost"))))
            smi.chmod(0o755)
            self.env[n] = {}
        self.write_journals()

    def journal_dir(self, node: str) -> Path:
        return Path(self.journal_pattern.replace("%n", node))

    def lose_gpu(self, node: str) -> None:
        """The node's GPU fell off the bus: its nvidia-smi no longer reaches it."""
        (self.probe_dir / node / "gpu-lost").touch()

    def write_journals(self, extra: dict[str, list[tuple[float, str]]] | None = None) -> None:
        """A fresh, benign kernel journal and a working GPU on every node, plus ``extra[node]``
        (time, message)."""
        now = time.time()
        for n in NODES:
            (self.probe_dir / n / "gpu-lost").unlink(missing_ok=True)
            ents = [
                JournalEntry(f"hrtimer: interrupt took {1200 + NODES.index(n)} ns",
                             int((now - 60) * 1e6), boot_id=self.boot_id, hostname=n),
                JournalEntry("mlx5_core 0000:17:00.0: mlx5_fw_tracer_handle_traces:736:(pid 0): "
                             "FW tracer event", int((now - 50) * 1e6), boot_id=self.boot_id,
                             hostname=n, priority=6),
            ]
            for t, msg in (extra or {}).get(n, []):
                ents.append(JournalEntry(msg, int(t * 1e6), boot_id=self.boot_id, hostname=n))
            write_journal(self.journal_dir(n) / "system.journal", ents)


@pytest.fixture(scope="module")
def work() -> Path:
    """World-writable scratch dir for job marker files (jobs of a non-root user too)."""
    d = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-work-"))
    d.chmod(0o1777)
    yield d
    if not KEEP:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> Nodes:
    root = tmp_path_factory.mktemp("hook-nodes")
    return Nodes(root)


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory_module, install, nodes) -> SlurmCluster:
    # JobRequeue=1 (Slurm's default) so a NODE_FAIL requeues unless --no-requeue; cred_expire=5
    # so a requeued job becomes eligible after ~6 s instead of 2 minutes.
    c = slurm_cluster_factory_module(
        nodes=NODES,
        epilog=str(install.epilog),
        epilog_slurmctld=str(install.epilog_ctld),
        node_env=nodes.env,
        job_requeue=True,
        cred_expire=5,
        slurmd_timeout=10,
    )
    install.base_settings = {"munge_socket": str(c.munge_socket),
                             "probe_path": str(nodes.probe_dir),
                             "journal_dir": nodes.journal_pattern}
    install.configure()
    print(f"cluster started in {c.start_seconds:.2f}s ({c.dir})")
    return c


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def cli_env(cluster: SlurmCluster, install: Install) -> dict[str, str]:
    # tests/conftest.py sets SATTRIB_DATABASE etc. for unit tests: they would override the
    # installed config, so drop every SATTRIB_ setting (the harness marker stays).
    env = {k: v for k, v in cluster.env.items()
           if not k.startswith("SATTRIB_") or k == HARNESS_MARKER_VAR}
    env["SATTRIB_CONFIG"] = str(install.config)
    return env


def sattrib(cluster: SlurmCluster, install: Install, *args: str, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(install.sattrib), *args], env=cli_env(cluster, install),
                       capture_output=True, text=True, timeout=timeout, cwd="/")
    if check:
        assert r.returncode == 0, f"sattrib {args} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def hook_health(install: Install, jid, restart: int = 0) -> tuple[dict, list]:
    """What the database keeps of the run's hooks: {node: snapshot (1, 0, None)} and the failed
    probes as (node, probe, reason)."""
    con = sqlite3.connect(f"file:{install.database}?mode=ro", uri=True, timeout=10)
    try:
        ids = [f"%/{jid}/{restart}"]
        snaps = dict(con.execute("SELECT node, snapshot FROM job_nodes WHERE diagnosis_id LIKE ?",
                                 ids).fetchall())
        probes = con.execute("SELECT node, probe, reason FROM failed_probes "
                             "WHERE diagnosis_id LIKE ? ORDER BY node", ids).fetchall()
        return snaps, probes
    finally:
        con.close()


def db_rows(install: Install, jid) -> list[dict]:
    db = install.database
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        cur = con.execute(
            "SELECT cluster, restart, diagnosis_json, bundle_path, created_at, updated_at "
            "FROM diagnoses WHERE job_id = ? ORDER BY cluster, restart", (str(jid),))
        return [dict(zip(("cluster", "restart", "json", "bundle", "created", "updated"), r))
                for r in cur.fetchall()]
    except sqlite3.OperationalError:          # no table yet
        return []
    finally:
        con.close()


def wait_diagnosis(cluster, install, jid, restart: int = 0, timeout: float = DIAGNOSIS_TIMEOUT):
    """Poll SQLite until the run's diagnosis is stored; returns (diagnosis dict, wall time)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in db_rows(install, jid) if r["restart"] == restart]
        if rows:
            return json.loads(rows[0]["json"]), time.time()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no diagnosis for job {jid}.{restart} within {timeout:.0f}s\n"
                + install.logs_tail() + "\n" + cluster.diagnostics())
        time.sleep(0.2)


def wait_files(d: Path, pattern: str, count: int, timeout: float = 30) -> list[Path]:
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(d.glob(pattern))
        if len(files) >= count:
            return files
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {count} files {pattern} in {d}, got {[f.name for f in files]}")
        time.sleep(0.1)


def job_end(work: Path, jid) -> float:
    """Wall-clock time the batch script wrote just before it exited."""
    return float((work / f"end.{jid}").read_text().split()[0])


def assert_nodes_not_drained(cluster: SlurmCluster, names, timeout: float = 30) -> dict:
    cluster.wait_nodes(names, {"idle"}, timeout=timeout)
    states = {n: cluster.node_state(n) for n in names}
    for n, s in states.items():
        assert "DRAIN" not in s and "FAIL" not in s, f"{n} is {s}: {cluster.node(n).get('Reason')}"
    return states


def kill_leftover_sleepers(cluster: SlurmCluster) -> None:
    """The 'escape' stand-in leaves a `sleep 100000` in its own session: end it (it carries the
    harness marker, so cluster.stop() would too)."""
    for pid in _procs_with_marker(str(cluster.dir)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[:2] == [b"sleep", b"100000"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# The ranks' output: realistic NCCL / PyTorch lines with current timestamps (glog style, UTC).
RANK_SCRIPT = r"""
W={work}
touch "$W/started.$SLURM_JOB_ID.$SLURMD_NODENAME"
i=0
while [ ! -e "$W/go.$SLURM_JOB_ID" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
sleep 1
ts() {{ date -u +%m%d\ %H:%M:%S.%6N; }}
r=$SLURM_PROCID; p=$$; h=$SLURMD_NODENAME
case $h in node01) ip={ip1};; node02) ip={ip2};; node03) ip={ip3};; *) ip={ip4};; esac
echo "$h:$p:$((p+700)) [0] NCCL INFO Bootstrap : Using ib0:$ip<0>"
echo "$h:$p:$((p+700)) [0] NCCL INFO NCCL version 2.21.5+cuda12.4"
echo "$h:$p:$((p+700)) [0] NCCL INFO ncclCommInitRank comm 0x55d0c3a0000$r rank $r nranks 4 cudaDev 0 nvmlDev 0 busId 1e0 commId 0x6d2e9b41c3f05a17 - Init COMPLETE"
case $h in
node02)
  echo "[rank$r]:[E$(ts) $p ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) Rank $r] Process group watchdog thread terminated with exception: CUDA error: uncorrectable NVLink error detected during the execution" >&2
  echo "terminate called after throwing an instance of 'c10::DistBackendError'" >&2 ;;
node01)
  sleep 0.3
  echo "$h:$p:$((p+700)) [0] misc/socket.cc:64 NCCL WARN socketProgress: Connection closed by remote peer node02<40461>"
  echo "[rank$r]:[E$(ts) $p ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) Rank $r] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5" >&2 ;;
node03)
  sleep 0.3
  echo "$h:$p:$((p+700)) [0] transport/net_ib.cc:2118 NCCL WARN NET/IB: Got completion from peer {ip2}<53002> with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_0"
  echo "[rank$r]:[E$(ts) $p ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) Rank $r] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5" >&2 ;;
*)
  sleep 0.5
  echo "[rank$r]:[E$(ts) $p ProcessGroupNCCL.cpp:682] [Rank $r] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=418733, OpType=ALLREDUCE, NumelIn=139460608, NumelOut=139460608, Timeout(ms)=600000) ran for 600133 milliseconds before timing out." >&2
  echo "[rank$r]:[E$(ts) $p ProcessGroupNCCL.cpp:630] [Rank $r] To avoid data inconsistency, we are taking the entire process down." >&2 ;;
esac
exit 1
"""


def nccl_job_script(work: Path) -> str:
    rank = RANK_SCRIPT.format(work=shlex.quote(str(work)), ip1=IPS["node01"], ip2=IPS["node02"],
                              ip3=IPS["node03"], ip4=IPS["node04"])
    (work / "rank.sh").write_text(rank)
    (work / "rank.sh").chmod(0o755)
    return (f"#!/bin/sh\nsrun -l --kill-on-bad-exit=0 sh {shlex.quote(str(work / 'rank.sh'))}\n"
            f"rc=$?\ndate +%s.%N > {shlex.quote(str(work))}/end.$SLURM_JOB_ID\nexit $rc\n")


def run_nccl_job(cluster, install, nodes, work, comment: str | None = None):
    """The 4-node job with NCCL errors on every rank and an Xid 149 on node02 during the job.

    Returns (jid, scontrol record, diagnosis, seconds from the job's end -- stamped by the batch
    script just before it exits -- to the diagnosis being in SQLite)."""
    nodes.write_journals()
    jid = cluster.sbatch(nccl_job_script(work), nodes=4, ntasks_per_node=1, job_name="llm-pretrain",
                         comment=comment)
    wait_files(work, f"started.{jid}.node0*", 4)
    # The NVLink fault happens now, while the ranks run; they report their errors afterwards.
    xid = (f"NVRM: Xid (PCI:{GPU_PCI}): 149, pid='<unknown>', name=<unknown>, NETIR_LINK_EVT  "
           "Fatal   XC0 i0 Link 07 (0x00a025c6 0x00000000 0x00000000 0x00000000 0x00000000 "
           "0x00000000)")
    nodes.write_journals({"node02": [(time.time(), xid)]})
    (work / f"go.{jid}").touch()
    info = cluster.wait_job(jid, {"FAILED"}, timeout=60)
    diag, t_stored = wait_diagnosis(cluster, install, jid)
    return jid, info, diag, t_stored - job_end(work, jid)


@pytest.fixture(scope="module")
def nvlink_job(cluster, install, nodes, work):
    jid, info, diag, latency = run_nccl_job(cluster, install, nodes, work)
    return {"jid": jid, "info": info, "diag": diag, "latency": latency}


# ---------------------------------------------------------------------------
# 1. the NVLink job
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(180)
def test_failed_job_is_diagnosed_nvlink_on_node02(cluster, install, nvlink_job):
    jid, diag, latency = nvlink_job["jid"], nvlink_job["diag"], nvlink_job["latency"]
    print(f"\njob {jid}: diagnosis stored {latency:.2f}s after the job's end "
          f"(collect_wait_s={COLLECT_WAIT_S})")
    record("job_end_to_diagnosis_s", round(latency, 2))
    assert latency < DIAGNOSIS_TIMEOUT

    root = diag["root_cause"]
    assert diag["outcome"] == "attributed", json.dumps(diag, indent=1)[:3000]
    assert root["category"] == "nvlink", root
    assert root["node"] == "node02", root
    # every node sent its snapshot: kernel and gpu evidence present everywhere
    comp = diag["completeness"]
    for n in NODES:
        assert f"kernel:{n}" in comp["present"], comp
        assert f"gpu:{n}" in comp["present"], comp
    assert not comp["failed_probes"], comp
    # the root evidence is the Xid line from node02's journal
    ev = {e["id"]: e for e in diag["evidence"]}
    roots = [ev[i] for i in root["evidence"] if i in ev]
    assert any(e["node"] == "node02" and e["source"] == "kernel" and "Xid" in e["text"]
               and "149" in e["text"] for e in roots), roots

    # what a user types
    r = sattrib(cluster, install, str(jid))
    print(r.stdout)
    assert "node02" in r.stdout and "nvlink" in r.stdout
    assert "link-down reason 10" in r.stdout
    j = json.loads(sattrib(cluster, install, str(jid), "--json").stdout)
    assert j["root_cause"]["node"] == "node02" and j["root_cause"]["category"] == "nvlink"

    # the spool was emptied, the bundle kept with one folder per node
    assert not (install.spool_dir / cluster.cluster_name / f"{jid}.0").exists()
    bundle = Path(db_rows(install, jid)[0]["bundle"])
    for n in NODES:
        assert (bundle / n / "nvidia-smi.xml").is_file()
        assert (bundle / n / "journal.jsonl").is_file()


# ---------------------------------------------------------------------------
# rerun of `sattrib collect` for a diagnosed job (as after a slurmctld restart)
# ---------------------------------------------------------------------------



def _rerun_collect(cluster, install, jid, extra_env=None):
    before = db_rows(install, jid)
    env = cli_env(cluster, install)
    env.update(extra_env or {})
    t0 = time.monotonic()
    r = subprocess.run([str(install.sattrib), "collect", str(jid), "--json"], env=env,
                       capture_output=True, text=True, timeout=120, cwd="/")
    print(f"\nsattrib collect {jid} (rerun{', ' + str(extra_env) if extra_env else ''}): "
          f"exit {r.returncode} in {time.monotonic() - t0:.1f}s")
    assert r.returncode == 0, r.stdout + r.stderr
    return before, db_rows(install, jid), json.loads(r.stdout)


@pytest.mark.slurm
@timeout(120)
def test_collect_rerun_gives_identical_diagnosis(cluster, install, nvlink_job):
    """Cluster name given explicitly (SATTRIB_CLUSTER), so only the rerun itself is tested.

    (Before collect.py replayed the kept bundle, a rerun rebuilt it from the spool, which the
    first diagnosis had emptied: every kernel/gpu source went missing and the stored diagnosis
    was replaced by a poorer one.)"""
    jid = nvlink_job["jid"]
    before, after, printed = _rerun_collect(
        cluster, install, jid, {"SATTRIB_CLUSTER": cluster.cluster_name})
    assert len(before) == 1 and before[0]["cluster"] == cluster.cluster_name, before
    assert [(a["cluster"], a["restart"]) for a in after] == [(cluster.cluster_name, 0)], after
    old, new = json.loads(before[0]["json"]), json.loads(after[0]["json"])
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    print(f"changed keys: {diff}; missing now: {new['completeness']['missing']}")
    assert new == old, f"rerun changed {diff}"
    assert printed == old


@pytest.mark.slurm
@timeout(120)
def test_collect_rerun_with_installed_config_keeps_one_row(cluster, install, nvlink_job):
    jid = nvlink_job["jid"]
    before, after, _ = _rerun_collect(cluster, install, jid)
    print(f"rows before: {[(b['cluster'], b['restart']) for b in before]}, "
          f"after: {[(a['cluster'], a['restart']) for a in after]}")
    assert len(before) == 1
    assert len(after) == 1, [(a["cluster"], a["restart"], a["bundle"]) for a in after]


# ---------------------------------------------------------------------------
# 2. a job that succeeds: nothing stored, nothing spooled, and the Epilog's cost
# ---------------------------------------------------------------------------


def epilog_env(cluster: SlurmCluster, nodes: Nodes, node: str, jid: str, failed: bool) -> dict:
    """What slurmd gives the Epilog (Slurm 22.05, see test_cluster_smoke.py) plus the harness's
    per-node env; no PATH, no HOME."""
    env = {
        "SLURMD_NODENAME": node, "SLURM_CLUSTER_NAME": cluster.cluster_name,
        "SLURM_CONF": str(cluster.conf_path), "SLURM_JOBID": jid, "SLURM_JOB_ID": jid,
        "SLURM_JOB_CPUS_PER_NODE": "1", "SLURM_JOB_GID": "0", "SLURM_JOB_NUM_NODES": "4",
        "SLURM_JOB_PARTITION": cluster.partition, "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_JOB_STDIN": "/dev/null", "SLURM_JOB_STDOUT": str(cluster.dir / "jobs" / "slurm-%j.out"),
        "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root", "SLURM_JOB_WORK_DIR": str(cluster.dir / "jobs"),
        "SLURM_NODELIST": "node[01-04]", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_UID": "0",
        "PWD": str(cluster.dir), HARNESS_MARKER_VAR: str(cluster.dir),
        "SLURM_JOB_EXIT_CODE": "256" if failed else "0",
        "SLURM_JOB_EXIT_CODE2": "1:0" if failed else "0:0",
        "SLURM_JOB_DERIVED_EC": "1" if failed else "0",
    }
    env.update(nodes.env[node])
    return env


def time_wrapper(wrapper: Path, env: dict, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = subprocess.run([str(wrapper)], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=EPILOG_BUDGET_S + 30, cwd="/")
        out.append((time.perf_counter() - t0) * 1000)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return out


@pytest.mark.slurm
@timeout(150)
def test_successful_job_no_diagnosis_and_epilog_overhead(cluster, install, nodes, work):
    nodes.write_journals()
    jid = cluster.sbatch(f"srun true\ndate +%s.%N > {shlex.quote(str(work))}/end.$SLURM_JOB_ID\n",
                         nodes=4, ntasks_per_node=1)
    info = cluster.wait_job(jid, {"COMPLETED"}, timeout=60)
    assert info["ExitCode"] == "0:0"
    t_end = job_end(work, jid)

    # Meanwhile: the Epilog's own cost, timed on the installed wrapper.
    n_ok, n_fail = 30, 5
    ok = time_wrapper(install.epilog, epilog_env(cluster, nodes, "node01", "990001", False), n_ok)
    fakes = [str(990010 + i) for i in range(n_fail)]   # one run each: a rerun does nothing
    try:
        bad = [time_wrapper(install.epilog, epilog_env(cluster, nodes, "node01", f, True), 1)[0]
               for f in fakes]
        for f in fakes:
            snap = install.spool_dir / cluster.cluster_name / f"{f}.0" / "node01.snap.gz"
            assert snap.is_file(), "the failed-job Epilog wrote no snapshot"
    finally:
        for f in fakes:
            shutil.rmtree(install.spool_dir / cluster.cluster_name / f"{f}.0", ignore_errors=True)
    assert not (install.spool_dir / cluster.cluster_name / "990001.0").exists()
    med_ok, med_bad = statistics.median(ok), statistics.median(bad)
    print(f"\nEpilog overhead, installed wrapper run directly (median of n):\n"
          f"  successful job: {med_ok:.1f} ms (n={n_ok}, min {min(ok):.1f}, max {max(ok):.1f})\n"
          f"  failed job:     {med_bad:.1f} ms (n={n_fail}, min {min(bad):.1f}, max {max(bad):.1f})")
    record("epilog_success_median_ms", round(med_ok, 2))
    record("epilog_failure_median_ms", round(med_bad, 1))
    record("epilog_success_samples_ms", [round(x, 2) for x in ok])
    record("epilog_failure_samples_ms", [round(x, 1) for x in bad])
    assert med_ok < 200, ok                        # shell fast path, no Python
    assert med_bad < EPILOG_BUDGET_S * 1000, bad

    # No diagnosis, even after the controller's whole snapshot wait.
    deadline = t_end + COLLECT_WAIT_S + 5
    while time.time() < deadline:
        assert not db_rows(install, jid), f"a successful job was diagnosed: {db_rows(install, jid)}"
        time.sleep(0.5)
    assert not db_rows(install, jid)
    assert not (install.spool_dir / cluster.cluster_name / f"{jid}.0").exists()
    assert not (install.bundle_dir / cluster.cluster_name / f"{jid}.0").exists()
    assert f"job {jid} on" not in install.log("epilog.log"), "Epilog started Python for exit 0"
    assert re.search(rf"job {jid}\.0: not diagnosed", install.log("worker.log")), install.logs_tail()


# ---------------------------------------------------------------------------
# 3. nvidia-smi hangs
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(150)
def test_hanging_nvidia_smi_does_not_cost_the_node(cluster, install, nodes, work):
    modes = {"node01": "hang", "node02": "noterm", "node03": "escape"}
    comment = " ".join(f"smi-{m}-{n}" for n, m in modes.items())
    try:
        # the installed wrapper run directly, the three variants at once, timed from outside
        procs = {}
        for n, m in modes.items():
            env = epilog_env(cluster, nodes, n, "990003", True)
            env["SLURM_JOB_COMMENT"] = comment
            procs[n] = (time.perf_counter(),
                        subprocess.Popen([str(install.epilog)], env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/"))
        direct = {}
        for n, (t0, p) in procs.items():
            p.communicate(timeout=EPILOG_BUDGET_S + 20)
            direct[n] = time.perf_counter() - t0
            assert p.returncode == 0, (n, p.returncode)
        print("\nEpilog wrapper with a hanging nvidia-smi, run directly: "
              + ", ".join(f"{modes[n]} {s:.2f}s" for n, s in direct.items()))
        record("epilog_hanging_nvidia_smi_s", {modes[n]: round(s, 2) for n, s in direct.items()})
        for n, s in direct.items():
            assert s < EPILOG_BUDGET_S, (modes[n], s)
        shutil.rmtree(install.spool_dir / cluster.cluster_name / "990003.0", ignore_errors=True)

        # and for real
        jid, info, diag, latency = run_nccl_job(cluster, install, nodes, work, comment=comment)
        print(f"job {jid}: diagnosis stored {latency:.2f}s after the job's end")
        states = assert_nodes_not_drained(cluster, NODES)
        print(f"node states: {states}")
        # each node Epilog logged its own duration: within the budget
        durations = {}
        for line in install.log("epilog.log").splitlines():
            m = re.search(rf"job {jid}\.0 on (node\d+): snapshot .*\((\d+\.\d+)s\)$", line)
            if m:
                durations[m.group(1)] = float(m.group(2))
        print(f"Epilog durations (hook's own log): {durations}")
        assert set(durations) == set(NODES), install.logs_tail()
        for n, s in durations.items():
            assert s < EPILOG_BUDGET_S, (n, s)
        assert not re.search(rf"job {jid}: epilog hook exited", install.log("epilog.log"))

        comp = diag["completeness"]
        print(f"failed probes: {comp['failed_probes']}\nmissing: {comp['missing']}")
        for n in modes:
            assert any(re.fullmatch(rf"nvidia-smi:{n} timed out .*", fp) for fp in comp["failed_probes"]), comp
            assert f"gpu:{n}" in comp["missing"], comp
        assert "gpu:node04" in comp["present"] and "gpu:node04" not in comp["missing"], comp
        # hook health: every snapshot arrived, three with a timed-out nvidia-smi
        snaps, probes = hook_health(install, jid)
        assert snaps == {n: 1 for n in NODES}, snaps
        assert [(n, p) for n, p, _ in probes] == [(n, "nvidia-smi") for n in sorted(modes)]
        assert all(r.startswith("timed out") for _, _, r in probes), probes
        # missing GPU evidence is not a GPU fault: the Xid still decides
        assert diag["root_cause"]["node"] == "node02" and diag["root_cause"]["category"] == "nvlink"
    finally:
        kill_leftover_sleepers(cluster)


# ---------------------------------------------------------------------------
# 4. a node dies mid-job
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_fail(cluster, install, nodes, work):
    """Two 4-node jobs on node03 when it crashes: A with --no-requeue (ends NODE_FAIL), B
    requeued (JobRequeue=1); B's second run exits 0."""
    nodes.write_journals()
    w = shlex.quote(str(work))
    step = (f"srun sh -c 'touch {w}/started.$SLURM_JOB_ID.$SLURMD_NODENAME; exec sleep 300'\n"
            f"date +%s.%N > {w}/end.$SLURM_JOB_ID\n")
    a = cluster.sbatch(step, nodes=4, ntasks_per_node=1, no_requeue=True)
    b = cluster.sbatch(f'[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ] && exit 0\n' + step, nodes=4,
                       ntasks_per_node=1)
    assert cluster.job(b)["Requeue"] == "1" and cluster.job(a)["Requeue"] == "0"
    wait_files(work, f"started.{a}.node0*", 4)
    wait_files(work, f"started.{b}.node0*", 4)
    t_kill = time.time()
    cluster.crash_node("node03")
    try:
        ainfo = cluster.wait_job(a, {"NODE_FAIL"}, timeout=60)
        t_fail = time.time()
        print(f"\nnode03 crashed; job {a} NODE_FAIL after {t_fail - t_kill:.1f}s")
        binfo = cluster.wait_job(b, {"PENDING"}, timeout=30)
        adiag, t_a = wait_diagnosis(cluster, install, a, timeout=DIAGNOSIS_TIMEOUT)
        print(f"diagnosis of {a} stored {t_a - t_fail:.1f}s after NODE_FAIL was seen")
        record("node_fail_detect_s", round(t_fail - t_kill, 1))
        record("node_fail_to_diagnosis_s", round(t_a - t_fail, 1))
        # B's failed run (restart 0): its worker starts at the same time as A's
        deadline = time.monotonic() + DIAGNOSIS_TIMEOUT
        while not db_rows(install, b) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        # bring the node back (ReturnToService=2); B runs again and succeeds
        cluster.start_slurmd("node03")
        cluster.wait_nodes(["node03"], {"idle", "mixed", "allocated", "completing"}, timeout=60)
    b2 = cluster.wait_job(b, {"COMPLETED"}, timeout=90)
    # B's second run exited 0; wait until its EpilogSlurmctld worker has decided about it
    deadline = time.monotonic() + COLLECT_WAIT_S + 30
    while (not re.search(rf"job {b}\.1: ", install.log("worker.log"))
           and time.monotonic() < deadline):
        time.sleep(0.2)
    brows = db_rows(install, b)
    return {"a": a, "b": b, "ainfo": ainfo, "binfo": binfo, "b2": b2, "adiag": adiag,
            "brows": brows}


@pytest.mark.slurm
@timeout(240)
def test_node_fail_blames_the_dead_node(cluster, install, node_fail):
    a, diag = node_fail["a"], node_fail["adiag"]
    assert node_fail["ainfo"]["Reason"] == "NodeDown"
    root = diag["root_cause"] or {}
    print(f"job {a}: {diag['outcome']} {root.get('category')} on {root.get('node')}; "
          f"missing {diag['completeness']['missing']}")
    assert root.get("category") == "scheduler_node_failure", json.dumps(diag, indent=1)[:3000]
    assert root.get("node") == "node03", root
    assert "kernel:node03" in diag["completeness"]["missing"], diag["completeness"]
    # hook health: the dead node is silent; the others took none (a NODE_FAIL ends with exit 0)
    snaps, _ = hook_health(install, a)
    assert snaps == {n: 0 if n == "node03" else None for n in NODES}, snaps
    rows = db_rows(install, a)
    assert [r["restart"] for r in rows] == [0], rows


BUG_REQUEUE_DERIVED = (
    "BUG collectors/slurm_env.py JobEnv.nonzero + install.sh Epilog fast path: the requeued run 1 "
    "exits 0 (JobState COMPLETED, SLURM_JOB_EXIT_CODE2=0:0) but SLURM_JOB_DERIVED_EC=15 is "
    "carried over from run 0's killed step, so every node Epilog snapshots (Python, ~1 s) and "
    "the worker stores an 'unattributed' diagnosis for a successful run (bundle <job>.1)")


@pytest.mark.slurm
@timeout(240)
def test_requeued_run_after_node_fail_gets_its_own_diagnosis(cluster, install, node_fail):
    b, rows = node_fail["b"], node_fail["brows"]
    assert node_fail["binfo"]["Restarts"] == "1"
    assert node_fail["b2"]["Restarts"] == "1"
    print(f"job {b}: rows {[(r['cluster'], r['restart']) for r in rows]}")
    # the worker did diagnose the failed run 0 (its EpilogSlurmctld saw exit code 0) ...
    assert re.search(rf"job {b}\.0: requeued .*; diagnosed", install.log("worker.log")), \
        install.logs_tail()
    bundle0 = install.bundle_dir / cluster.cluster_name / f"{b}.0" / "diagnosis.json"
    assert bundle0.is_file()
    d0 = json.loads(bundle0.read_text())
    print(f"bundle {b}.0: restart {d0.get('restart')}, job state {d0['job'].get('state')}, "
          f"{d0['outcome']} {(d0['root_cause'] or {}).get('category')} on "
          f"{(d0['root_cause'] or {}).get('node')}")
    assert (d0["root_cause"] or {}).get("category") == "scheduler_node_failure", d0["root_cause"]
    assert d0["root_cause"]["node"] == node_fail.get("dead", "node03"), d0["root_cause"]
    # ... and it must be stored as run 0
    assert d0.get("restart") == 0, f"diagnosis of run 0 says restart {d0.get('restart')}"
    run0 = [r for r in rows if r["restart"] == 0]
    assert run0, f"no row for run 0 of job {b}: {[(r['cluster'], r['restart']) for r in rows]}"
    assert json.loads(run0[0]["json"])["root_cause"]["category"] == "scheduler_node_failure"


@pytest.mark.slurm
@timeout(240)
def test_requeued_run_that_succeeds_is_not_diagnosed(cluster, install, node_fail):
    b = node_fail["b"]
    assert node_fail["b2"]["JobState"] == "COMPLETED" and node_fail["b2"]["ExitCode"] == "0:0"
    worker = [ln for ln in install.log("worker.log").splitlines() if f"job {b}.1:" in ln]
    snaps = [ln for ln in install.log("epilog.log").splitlines() if f"job {b}.1 on" in ln]
    print(f"run 1 of job {b}: worker {worker}; {len(snaps)} node snapshots")
    assert not snaps, snaps
    assert not (install.bundle_dir / cluster.cluster_name / f"{b}.1").exists()
    assert not any("; diagnosed" in ln for ln in worker), worker


# ---------------------------------------------------------------------------
# 5. hostile output paths of a non-root user
# ---------------------------------------------------------------------------

TEST_USER = "sattrib-hooktest"


@pytest.fixture(scope="module")
def job_user():
    created = False
    try:
        pw = pwd.getpwnam(TEST_USER)
    except KeyError:
        r = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group",
                            TEST_USER], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        created = True
        pw = pwd.getpwnam(TEST_USER)
    yield pw
    if created:
        subprocess.run(["userdel", TEST_USER], capture_output=True, timeout=30)


@pytest.mark.slurm
@timeout(150)
def test_user_output_symlink_and_fifo_are_not_read(cluster, install, nodes, work, job_user):
    nodes.write_journals()
    marker = f"SATTRIB-SECRET-{uuid.uuid4().hex}"
    secret_dir = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-secret-"))
    udir = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-user-"))
    try:
        secret_dir.chmod(0o755)
        secret = secret_dir / "secret.txt"
        secret.write_text(f"{marker}\nroot-only data\n")
        secret.chmod(0o600)
        udir.chmod(0o755)
        os.chown(udir, job_user.pw_uid, job_user.pw_gid)
        out = udir / "out-%j.txt"
        err = udir / "err-%j.txt"
        w = shlex.quote(str(work))
        # The ranks fail; then, before the job ends, the user swaps its own output paths: stderr
        # becomes a symlink to the root-only secret, stdout a FIFO (nobody ever writes it).
        script = textwrap.dedent(f"""\
            #!/bin/sh
            srun -l sh -c 'echo "$SLURMD_NODENAME:$$:$(($$+700)) [0] NCCL INFO Bootstrap : Using ib0:10.40.8.1$SLURM_PROCID<0>"; echo "[rank$SLURM_PROCID]:[E$(date -u +%m%d\\ %H:%M:%S.%6N) $$ ProcessGroupNCCL.cpp:1896] [Rank $SLURM_PROCID] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5" >&2; exit 1'
            ERR={shlex.quote(str(udir))}/err-$SLURM_JOB_ID.txt
            OUT={shlex.quote(str(udir))}/out-$SLURM_JOB_ID.txt
            rm -f "$ERR" && ln -s {shlex.quote(str(secret))} "$ERR"
            rm -f "$OUT" && mkfifo "$OUT"
            date +%s.%N > {w}/end.$SLURM_JOB_ID
            exit 1
            """)
        env = cluster.env
        r = subprocess.run(
            ["runuser", "-u", TEST_USER, "--", "sbatch", "--parsable", "--nodes=2",
             "--ntasks-per-node=1", f"--chdir={udir}", f"--output={out}", f"--error={err}"],
            input=script, env=env, capture_output=True, text=True, timeout=60, cwd=str(udir))
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout.strip().split(";")[0])
        info = cluster.wait_job(jid, {"FAILED"}, timeout=60)
        assert info["UserId"].startswith(TEST_USER), info["UserId"]
        errp, outp = udir / f"err-{jid}.txt", udir / f"out-{jid}.txt"
        assert errp.is_symlink() and outp.is_fifo(), (errp, outp)
        t0 = time.monotonic()
        diag, t_stored = wait_diagnosis(cluster, install, jid)
        print(f"\njob {jid} (user {TEST_USER}): diagnosis stored {t_stored - job_end(work, jid):.2f}s "
              f"after the job's end")
        notes = diag["completeness"]["notes"]
        print("completeness notes:\n  " + "\n  ".join(notes))
        assert any(str(errp) in n for n in notes), notes
        assert any(str(outp) in n for n in notes), notes

        # the marker is nowhere sattrib writes: bundles, database (+WAL), spool, logs
        hits = []
        for top in (install.prefix / "var", install.prefix / "etc"):
            for dirpath, dirnames, filenames in os.walk(top):
                for f in filenames:
                    p = Path(dirpath) / f
                    if p.is_symlink() or not p.is_file():
                        continue
                    if marker.encode() in p.read_bytes():
                        hits.append(str(p))
        assert not hits, f"the root-only secret leaked into {hits}"
        bundle = Path(db_rows(install, jid)[0]["bundle"])
        for p in bundle.rglob("*"):
            assert not p.is_symlink() and not p.is_fifo(), p
        assert time.monotonic() - t0 < DIAGNOSIS_TIMEOUT

        # Private: nothing in the bundle or the database is readable by other users; the
        # job's user reads their own bundle (ACL) and gets `sattrib JOBID` from it.
        for p in [bundle, *bundle.rglob("*"), Path(install.settings["database"])]:
            assert stat.S_IMODE(p.stat().st_mode) & 0o007 == 0, (p, oct(p.stat().st_mode))
        def as_user(*argv):        # setpriv: runuser's PAM session may not reach the venv's python
            return subprocess.run(["setpriv", f"--reuid={job_user.pw_uid}",
                                   f"--regid={job_user.pw_gid}", "--init-groups",
                                   *map(str, argv)],
                                  env=dict(env, SATTRIB_CONFIG=str(install.config)),
                                  capture_output=True, text=True, timeout=60, cwd="/")
        assert as_user("cat", install.settings["database"]).returncode != 0
        r = as_user("cat", bundle / "diagnosis.json")
        assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == str(jid), r.stderr
        r = as_user(install.sattrib, str(jid))
        assert r.returncode == 0 and f"Job {jid}" in r.stdout, r.stdout + r.stderr
    finally:
        shutil.rmtree(udir, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# 6. scancel
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(120)
def test_scancel_is_cancelled_with_no_node_blamed(cluster, install, nodes, work):
    nodes.write_journals()
    w = shlex.quote(str(work))
    jid = cluster.sbatch(
        f"srun sh -c 'touch {w}/started.$SLURM_JOB_ID.$SLURMD_NODENAME; exec sleep 300'\n",
        nodes=2, ntasks_per_node=1)
    wait_files(work, f"started.{jid}.node0*", 2)
    t_cancel = time.time()
    cluster.scancel(jid)
    cluster.wait_job(jid, {"CANCELLED"}, timeout=60)
    diag, t_stored = wait_diagnosis(cluster, install, jid)
    print(f"\njob {jid}: diagnosis stored {t_stored - t_cancel:.2f}s after scancel")
    root = diag["root_cause"]
    assert root is not None, json.dumps(diag, indent=1)[:3000]
    assert root["category"] == "scheduler_cancelled", root
    assert root["node"] is None, root
    snaps, _ = hook_health(install, jid)        # no snapshot was due: not a silent node
    assert set(snaps.values()) == {None}, snaps
    assert_nodes_not_drained(cluster, NODES)


# ---------------------------------------------------------------------------
# 7. never lose a diagnosis: no slurmctld for scontrol, a typo in sattrib.toml
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(120)
def test_worker_without_slurmctld_files_the_diagnosis_under_the_job(cluster, install, work):
    """slurm.conf outside the default place and SLURM_CONF wrong in EpilogSlurmctld's
    environment: scontrol fails, and the facts slurmctld passed (22.05's job_common_env_vars)
    still file the diagnosis under the job, with its output read from the expanded out.%j."""
    jid = "990101"
    (work / f"out.{jid}").write_text(
        "Traceback (most recent call last):\n  File \"train.py\", line 7, in <module>\n"
        "ValueError: learning rate must be positive\n")
    env = {
        "SLURM_CONF": "/nonexistent/slurm.conf", HARNESS_MARKER_VAR: str(cluster.dir),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld", "SLURM_CLUSTER_NAME": cluster.cluster_name,
        "SLURM_JOBID": jid, "SLURM_JOB_ID": jid, "SLURM_JOB_NAME": "lr-sweep",
        "SLURM_JOB_ACCOUNT": "root", "SLURM_JOB_PARTITION": cluster.partition,
        "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
        "SLURM_JOB_GROUP": "root", "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_DERIVED_EC": "1",
        "SLURM_JOB_STDOUT": str(work / "out.%j"), "SLURM_JOB_STDERR": str(work / "out.%j"),
        "SLURM_JOB_WORK_DIR": str(work),
    }
    try:                   # scontrol retries a missing slurm.conf for 60 s, then fails
        probe = subprocess.run(["scontrol", "show", "job", jid], env=env, capture_output=True,
                               text=True, timeout=5)
        assert probe.returncode != 0, "scontrol must fail with this SLURM_CONF"
        said = probe.stderr
    except subprocess.TimeoutExpired as e:
        said = (e.stderr or b"").decode()
    t0 = time.monotonic()
    r = subprocess.run([str(install.epilog_ctld)], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30, cwd="/")
    assert r.returncode == 0, r
    diag, _ = wait_diagnosis(cluster, install, jid)
    record("no_slurmctld_worker_to_diagnosis_s", round(time.monotonic() - t0, 1))
    print(f"\nscontrol: {said.strip()[:120]}\nstored after {time.monotonic() - t0:.1f}s"
          "\nmissing: "
          f"{diag['completeness']['missing']}\nnotes: {diag['completeness']['notes'][:3]}")
    assert diag["job_id"] == jid
    assert diag["job"]["name"] == "lr-sweep" and diag["job"]["user"] == "root"
    assert "scheduler:job" in diag["completeness"]["missing"]
    assert any(f"scontrol show job {jid} failed" in n for n in diag["completeness"]["notes"])
    assert diag["root_cause"]["category"] == "application_error", diag["root_cause"]
    bundle = Path(db_rows(install, jid)[0]["bundle"])
    assert "ValueError" in (bundle / "logs" / "output-000.txt").read_text()
    shown = sattrib(cluster, install, jid)                 # what the user types finds it
    assert "application_error" in shown.stdout, shown.stdout
    assert not db_rows(install, "unknown")


@pytest.mark.slurm
@timeout(150)
def test_config_typo_costs_no_snapshot_and_no_diagnosis(cluster, install, nodes, work):
    """`databse = ...` in the installed sattrib.toml: the real node Epilogs and the real
    EpilogSlurmctld go on with the defaults for that key, and the diagnosis says so."""
    nodes.write_journals()
    install.raw_extra = 'databse = "/tmp/sattrib-typo.db"\n'
    install.configure()
    try:
        jid = cluster.sbatch(f"srun sh -c 'echo \"RuntimeError: boom\" >&2; exit 3'\n"
                             f"date +%s.%N > {shlex.quote(str(work))}/end.$SLURM_JOB_ID\n"
                             "exit 3\n", nodes=2, ntasks_per_node=1)
        cluster.wait_job(jid, {"FAILED"}, timeout=60)
        diag, _ = wait_diagnosis(cluster, install, jid)
    finally:
        install.raw_extra = ""
        install.configure()
    notes = diag["completeness"]["notes"]
    print("\n" + "\n".join(n for n in notes if "databse" in n))
    assert any(n.startswith("config: ") and "unknown key 'databse'" in n for n in notes), notes
    for n in ("node01", "node02"):                        # the node Epilogs took snapshots
        assert f"kernel:{n}" in diag["completeness"]["present"], diag["completeness"]
        assert any(x.startswith(f"{n}: config: ") and "databse" in x for x in notes), notes
    assert "unknown key 'databse'" in install.log("worker.log")


# ---------------------------------------------------------------------------
# per-node output scanned on the nodes: the Epilogs ship extracts, not bytes
# ---------------------------------------------------------------------------

PER_NODE_RANK = r"""
i=0
while [ $i -lt 2000 ]; do echo "step $i loss 2.$i lr 3e-4"; i=$((i+1)); done
if [ "$SLURMD_NODENAME" = node02 ]; then
  echo 'Traceback (most recent call last):' >&2
  echo '  File "/w/train.py", line 40, in <module>' >&2
  echo '  File "/w/packed.py", line 118, in pack' >&2
  echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2
else
  sleep 1
  echo "[rank0]:[E$(date -u +%m%d\ %H:%M:%S.%6N) $$ ProcessGroupNCCL.cpp:1896] [Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5" >&2
fi
exit 1
"""


@pytest.mark.slurm
@timeout(300)
def test_per_node_output_is_shipped_as_extracts(slurm_cluster_factory, install, nodes, work):
    """`--output=DIR/%N.out` on two nodes whose host names are their node names: each node's
    Epilog scans its own file and ships the kept lines; the bundle holds the two extracts and no
    copy, and the stored diagnosis is the one the full files give."""
    two = NODES[:2]
    c = slurm_cluster_factory(nodes=two, own_hostnames=True, cluster_name="sattribscale",
                              epilog=str(install.epilog),
                              epilog_slurmctld=str(install.epilog_ctld),
                              node_env={n: nodes.env[n] for n in two}, slurmd_timeout=10)
    saved = dict(install.base_settings)
    install.base_settings = {"munge_socket": str(c.munge_socket),
                             "probe_path": str(nodes.probe_dir),
                             "journal_dir": nodes.journal_pattern}
    install.configure()
    try:
        nodes.write_journals()
        out = work / f"pernode-{uuid.uuid4().hex[:8]}"
        out.mkdir()
        (out / "rank.sh").write_text(PER_NODE_RANK)
        pattern = str(out / "%N.out")
        jid = c.sbatch(f"srun --open-mode=append --output={pattern} sh {out / 'rank.sh'}\n",
                       nodes=2, ntasks_per_node=1, output=pattern, open_mode="append")
        c.wait_job(jid, {"FAILED"}, timeout=60)
        t_end = time.monotonic() + DIAGNOSIS_TIMEOUT
        while not (rows := [r for r in db_rows(install, jid) if r["cluster"] == "sattribscale"]):
            assert time.monotonic() < t_end, install.logs_tail() + "\n" + c.diagnostics()
            time.sleep(0.3)
    finally:
        install.base_settings = saved
        install.configure()
    stored = json.loads(rows[0]["json"])
    bundle = Path(rows[0]["bundle"])
    record = json.loads((bundle / "slurm" / "sattrib-run.json").read_text())
    assert sorted((o.get("node"), o["source"]) for o in record["outputs"]) == [
        ("node01", str(out / "node01.out")), ("node02", str(out / "node02.out"))], record
    logs = sorted(p.name for p in (bundle / "logs").iterdir())
    assert logs == ["output-000.txt.lines", "output-001.txt.lines"], logs
    epilog_log = install.log("epilog.log")
    assert "extracts of 1 output files" in epilog_log, epilog_log[-2000:]
    assert stored["root_cause"]["category"] == "application_error", stored["root_cause"]
    assert stored["root_cause"]["user_frames"][0]["file"] == "/w/packed.py"

    # The same bundle with the original files in place of the extracts.
    full = work / f"full-{jid}"
    shutil.copytree(bundle, full)
    for o in record["outputs"]:
        (full / o["extract"]).unlink()
        shutil.copy(o["source"], full / o["extract"].removesuffix(".lines"))
    assert not list((full / "logs").glob("*.lines"))
    want = sattrib(c, install, "analyze", str(full), "--json").stdout
    assert sattrib(c, install, "analyze", str(bundle), "--json").stdout == want
    assert json.loads(want) == stored
    print(f"\nper-node extracts: {[(p.name, p.stat().st_size) for p in (bundle / 'logs').iterdir()]}"
          f" for {[(p.name, p.stat().st_size) for p in sorted(out.glob('*.out'))]}")


# ---------------------------------------------------------------------------
# flight-recorder dumps: read on the node as the job's user, shipped as facts
# ---------------------------------------------------------------------------


@pytest.mark.slurm
@timeout(180)
def test_flight_recorder_dumps_are_shipped_as_facts_and_say_where_the_job_stopped(
        cluster, install, nodes, work, job_user):
    """A hung job of 8 ranks (4 nodes x 2) whose rank 5 never scheduled the all_reduce the
    others wait in: each rank dumps its flight recorder into its node's folder, each node's
    Epilog reads the dumps there (only the job user's own regular files) and ships their facts,
    never the pickles; the stored diagnosis names rank 5 on node03."""
    import pickle

    from fr_dumps import Job
    nodes.write_journals()
    base = work / f"fr-{uuid.uuid4().hex[:8]}"
    src, dumps = base / "src", base / "dumps" / TEST_USER
    src.mkdir(parents=True)
    job = Job(8, per_node=2, only_active=False, t0=time.time_ns())
    job.at("0", range(8), 300, 299)
    job.at("0", [5], 299, 299)
    for r in range(8):
        (src / f"rank_{r}").write_bytes(pickle.dumps(job.dump(r), protocol=2))
    for n in NODES:
        (dumps / n).mkdir(parents=True)
        os.chown(dumps / n, job_user.pw_uid, job_user.pw_gid)
    base.chmod(0o755)
    # In node02's folder: a dump owned by root, a link to one, and one of a job two days ago.
    planted = dumps / "node02"
    (planted / "nccl_trace_rank_12").write_bytes((src / "rank_3").read_bytes())
    (planted / "nccl_trace_rank_13").symlink_to(src / "rank_3")
    old = Job(16, only_active=False, t0=time.time_ns() - 2 * 86400 * 10**9)
    old.at("0", range(16), 10, 9)
    stale = planted / "nccl_trace_rank_14"
    stale.write_bytes(pickle.dumps(old.dump(14), protocol=2))
    os.chown(stale, job_user.pw_uid, job_user.pw_gid)
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    install.configure(flight_recorder_globs=[f"{base}/dumps/%u/%N/nccl_trace_rank_*"])
    udir = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-fr-"))
    try:
        udir.chmod(0o755)
        os.chown(udir, job_user.pw_uid, job_user.pw_gid)
        q = shlex.quote
        rank = (f"cp {q(str(src))}/rank_$SLURM_PROCID {q(str(dumps))}/$SLURMD_NODENAME/"
                "nccl_trace_rank_$SLURM_PROCID; echo \"[rank$SLURM_PROCID]:[E$(date -u +%m%d\\ "
                "%H:%M:%S.%6N) $$ ProcessGroupNCCL.cpp:682] [Rank $SLURM_PROCID] Watchdog caught"
                " collective operation timeout: WorkNCCL(SeqNum=300, OpType=ALLREDUCE, "
                "Timeout(ms)=600000) ran for 600133 milliseconds before timing out.\" >&2; exit 1")
        script = (f"#!/bin/sh\nsrun --kill-on-bad-exit=0 sh -c {q(rank)}\n"
                  f"date +%s.%N > {q(str(work))}/end.$SLURM_JOB_ID\nexit 1\n")
        r = subprocess.run(
            ["runuser", "-u", TEST_USER, "--", "sbatch", "--parsable", "--nodes=4",
             "--ntasks-per-node=2", f"--chdir={udir}", f"--output={udir}/out-%j.txt"],
            input=script, env=cluster.env, capture_output=True, text=True, timeout=60,
            cwd=str(udir))
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout.strip().split(";")[0])
        cluster.wait_job(jid, {"FAILED"}, timeout=60)
        diag, t_stored = wait_diagnosis(cluster, install, jid)
    finally:
        install.configure()
        shutil.rmtree(udir, ignore_errors=True)
    loc = diag["localization"]
    assert (loc["ranks"], loc["nodes"]) == ([5], ["node03"]), loc
    assert loc["how"].startswith("the job stopped at rank 5 (node03): 7 ranks waited for it in "
                                 "all_reduce #300 of default_pg; it never scheduled it"), loc["how"]
    assert diag["outcome"] == "unattributed" and diag["action_code"] == "inspect_node"
    bundle = Path(db_rows(install, jid)[0]["bundle"])
    assert sorted(p.parent.name for p in bundle.glob("*/flight-recorder.json")) == NODES
    assert not list(bundle.rglob("nccl_trace_rank_*")), "a pickle was copied"
    shipped = json.loads((bundle / "node02" / "flight-recorder.json").read_text())
    read = sorted(d["rank"] for d in shipped["dumps"] if d.get("groups"))
    notes = "\n".join(diag["completeness"]["notes"])
    assert f"{planted}/nccl_trace_rank_12: is owned by uid 0, not the job's user" in notes
    assert f"{planted}/nccl_trace_rank_13: is a symbolic link (not followed)" in notes
    # The stale dump: left on the node by its file time where the Epilog knows the job's
    # start (Slurm 23.02 on); else its own entries say it was written before this job.
    assert read in ([2, 3], [2, 3, 14]), read
    if 14 in read:
        assert "node02/flight-recorder.json: events before the job's time window ignored" in notes
    assert "flight-recorder.json" in install.log("epilog.log")
    print(f"\nflight recorder: job {jid} localized to {loc['nodes']} rank {loc['ranks']}, "
          f"stored {t_stored - job_end(work, jid):.2f}s after the job's end")

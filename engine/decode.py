"""Decoders: what a catalog or a format knows about one matched line, beyond the rule's regex.

A rule names its decoder (`decode: xid`). A decoder reads the captures of one hit and refines the
event: the Xid catalog's category and role, an IB completion status, the reason in a Slurm
cancel banner, a task exit's signal. Decoders look at one line only; relating lines to each other
is the pipeline's correlate stage.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from . import xid as xidcat
from .lineparse import TimeContext, parse_stamp_text
from .models import Line

if TYPE_CHECKING:
    from .models import Record as Rule
from .taxonomy import Action, Category, Role, Source, Tag


@dataclass(slots=True)
class Event:
    """One rule hit on one line, refined step by step by the pipeline."""
    rule: Rule
    line: Line
    caps: dict
    category: Optional[Category]
    role: Role
    source: Source
    node: Optional[str]
    rank: Optional[int]
    gpu: Optional[str] = None
    pid: Optional[int] = None
    lo: Optional[float] = None      # earliest instant the event can have happened
    hi: Optional[float] = None      # latest instant
    action: Action = Action.none
    detail: str = ""
    weak: bool = False              # a program-level or "maybe hardware" signal
    last_resort: bool = False       # a root only when nothing else in the job is one
    suggests: bool = False          # points at its cause without proving it (rule_spec.proves)
    explained_by: tuple = ()        # families whose trusted incident on the node explains it
    catalog_row: str = ""           # "<catalog>:<line>" of the row that classified it
    blame: Optional[tuple] = None   # (category, Blame) its rule or catalog row declares
    tags: frozenset = frozenset()   # rebound, never mutated: most events carry none
    peer: Optional[str] = None      # host or address this line blames (a locator)
    points_at: Optional[str] = None  # the job's node that peer is (correlate)
    when: Optional[float] = None    # instant stated inside the message (CANCELLED AT ...)
    id: str = ""
    root: Optional[str] = None
    why: str = ""                   # why the pipeline demoted or promoted it

    def tag(self, *names: str) -> None:
        self.tags = self.tags.union(names)

    def sort_key(self):
        ln = self.line
        return (ln.doc, ln.offset, self.rule.id)


def normalize_pci(pci: Optional[str]) -> Optional[str]:
    """`0000:9d:00` / `00000000:9D:00.0` / `9d:00.0` -> `0000:9d:00.0`."""
    if not pci:
        return None
    p = pci.strip().lower()
    m = re.match(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.([0-7]))?$", p)
    if not m:
        return p
    dom = (m.group(1) or "0")[-4:].rjust(4, "0")
    return f"{dom}:{m.group(2).rjust(2, '0')}:{m.group(3).rjust(2, '0')}.{m.group(4) or '0'}"


Decoder = Callable[[Event, TimeContext], None]
DECODERS: dict[str, Decoder] = {}


def decoder(fn: Decoder) -> Decoder:
    DECODERS[fn.__name__] = fn
    return fn


def catalog_digest() -> str:
    return xidcat.catalog_digest()


@decoder
def xid(ev: Event, tc: TimeContext) -> None:
    code = int(ev.caps.get("xid", "0"))
    v = xidcat.classify(code, ev.caps.get("body", ""))
    ev.category, ev.role, ev.weak, ev.suggests = v.category, v.role, v.weak, v.suggests
    ev.tag(*v.tags, Tag.gpu_xid, f"xid{v.code}")
    ev.action = v.action
    ev.detail = v.detail
    pid = ev.caps.get("pid", "").strip("'")
    if pid.isdigit():
        ev.pid = int(pid)
    if ev.category == Category.application_error:
        # An Xid that NVIDIA's catalog puts on the program is that program's fault when it names
        # the process it stopped; with no process (pid 0, '<unknown>') a faulty GPU fits as well.
        ev.suggests = not ev.pid


# libibverbs enum ibv_wc_status, as NCCL prints it (error-signatures NCCL-01).
_IB_ROOT = {4: (Category.network_config, "local protection error (GPUDirect RDMA / ACS / "
                "memory registration)")}
_IB_NAMES = {1: "LOC_LEN_ERR", 2: "LOC_QP_OP_ERR", 4: "LOC_PROT_ERR", 5: "WR_FLUSH_ERR",
             7: "BAD_RESP_ERR", 8: "LOC_ACCESS_ERR", 9: "REM_INV_REQ_ERR", 10: "REM_ACCESS_ERR",
             11: "REM_OP_ERR", 12: "RETRY_EXC_ERR", 13: "RNR_RETRY_EXC_ERR",
             20: "RESP_TIMEOUT_ERR", 21: "GENERAL_ERR"}


_IB_RETRY = {12, 13}      # RETRY_EXC_ERR, RNR_RETRY_EXC_ERR


@decoder
def ib_completion(ev: Event, tc: TimeContext) -> None:
    st = int(ev.caps.get("status") or ev.caps.get("status2") or 0)
    ev.tag(f"ibstatus{st}")
    ev.detail = f"status {st} ({_IB_NAMES.get(st, 'unknown')})"
    if st in _IB_ROOT:
        # One side's completion status points at the set-up (GPUDirect RDMA, ACS, memory
        # registration) without proving it.
        ev.category, why = _IB_ROOT[st]
        ev.role, ev.weak, ev.suggests, ev.detail = Role.root, True, True, why
        ev.action = Action.fix_network_config
    elif st in _IB_RETRY:
        # The peer's HCA never acknowledged: a dead peer process explains it as well as a bad
        # link, so it names the network only when nothing else in the job is a cause.
        ev.category, ev.role = Category.network_ib, Role.root
        ev.weak = ev.last_resort = ev.suggests = True
        ev.action = Action.inspect_network_link
        ev.detail = f"status {st} ({_IB_NAMES[st]}): the transport gave up retrying"
    else:
        ev.role = Role.symptom


_CANCEL = {
    "TIME LIMIT": (Category.scheduler_timelimit, Role.root),
    "PREEMPTION": (Category.scheduler_preemption, Role.root),
    "NODE FAILURE": (Category.scheduler_node_failure, Role.confirmation),
    "JOB REQUEUE": (Category.scheduler_preemption, Role.context),
    "TASK FAILURE": (Category.scheduler_cancelled, Role.symptom),
}


@decoder
def slurm_cancel(ev: Event, tc: TimeContext) -> None:
    """The cancel banner's reason decides. With no reason, Slurm prints the same banner for a
    user's scancel and for srun (or the memory enforcement) killing the step after a failure:
    the banner alone is then only a cause of last resort, and a user's cancel only when the
    scheduler's record says who cancelled (see `cancel_record`)."""
    # 14.11 to 15.08 named the failed node inside the reason: "DUE TO NODE gn07 FAILURE".
    reason = (ev.caps.get("reason") or ("NODE FAILURE" if ev.caps.get("failnode") else "")).upper()
    for key, (cat, role) in _CANCEL.items():
        if reason.startswith(key):
            ev.category, ev.role = cat, role
            break
    else:  # no reason, or "DUE to SIGNAL ..." (25.05+)
        ev.category, ev.role = Category.scheduler_cancelled, Role.root
        ev.last_resort = ev.suggests = True
        ev.tag(Tag.bare_cancel)
    at = parse_stamp_text(ev.caps.get("at") or "")
    ev.when = tc.epoch(at)


@decoder
def cancel_record(ev: Event, tc: TimeContext) -> None:
    """The scheduler's record of who cancelled the job (REQUEST_KILL_JOB ... uid N)."""
    ev.tag(Tag.cancel_record)


_CRASH_SIGNALS = {4, 7, 8, 11}
_SIGNALS = {"Killed": 9, "Aborted": 6, "Segmentation fault": 11, "Bus error": 7,
            "Terminated": 15, "Floating point exception": 8, "Illegal instruction": 4}


@decoder
def srun_exit(ev: Event, tc: TimeContext) -> None:
    how = ev.caps.get("how") or ""
    tasks = ev.caps.get("tasks") or ""
    if tasks:
        ev.tag(Tag.task_list)
    if tasks.isdigit():
        ev.rank = int(tasks)
    if how.startswith("Out Of Memory"):
        ev.category, ev.role = Category.host_oom, Role.root
        ev.action = Action.reduce_host_memory
        return
    ev.role = Role.symptom
    ev.tag(Tag.task_exit)
    sig = _SIGNALS.get(how.split(" (")[0])
    code = how.rsplit(" ", 1)[-1]
    if how.startswith("Exited with exit code"):
        ev.tag(Tag.exit_code)
        if code.isdigit() and int(code) != 0:
            # A task's own non-zero exit: the program failed there, but the exit code alone
            # says nothing more; it names the cause only when nothing else in the job does.
            ev.category, ev.role = Category.application_error, Role.root
            ev.weak = ev.last_resort = ev.suggests = True
            ev.action = Action.fix_application
    elif sig is not None:
        ev.tag(f"signal{sig}")
        if sig == _SIGNALS["Killed"]:
            ev.tag(Tag.task_killed)
        if sig in _CRASH_SIGNALS:
            # The task crashed on its own (SIGSEGV, SIGBUS, SIGFPE, SIGILL). SIGKILL and SIGTERM
            # are what srun sends the other tasks while it tears the step down, and SIGABRT is
            # how PyTorch's watchdog takes a process down after a collective timed out.
            ev.category, ev.role = Category.application_error, Role.root
            ev.weak = ev.last_resort = True
            ev.action = Action.fix_application


_STATES = {
    "NODE_FAIL": (Category.scheduler_node_failure, Role.root),
    "BOOT_FAIL": (Category.scheduler_node_failure, Role.root),
    "OUT_OF_MEMORY": (Category.host_oom, Role.confirmation),
    "TIMEOUT": (Category.scheduler_timelimit, Role.confirmation),
    "DEADLINE": (Category.scheduler_timelimit, Role.confirmation),
    "PREEMPTED": (Category.scheduler_preemption, Role.confirmation),
}


@decoder
def job_state(ev: Event, tc: TimeContext) -> None:
    # `JobState=S` (scontrol) or sacct's State column (`CANCELLED by 41022`).
    state = (ev.caps.get("state") or ev.caps.get("state2") or "").upper()
    if state.startswith("CANCELLED"):
        ev.category, ev.role = Category.scheduler_cancelled, Role.confirmation
        if "BY" in state:
            ev.tag(Tag.cancel_record)
        return
    cat_role = _STATES.get(state)
    if cat_role is None:
        ev.category, ev.role = None, Role.context
        return
    ev.category, ev.role = cat_role
    if ev.category == Category.scheduler_node_failure:
        # The record says a node failed, not which one; slurmctld/srun lines name it.
        ev.weak = True


_BLOCK = {
    "time": re.compile(r"^\s*time\s*:\s*(\S+)"),
    "rank": re.compile(r"^\s*rank\s*:\s*(\d+)"),
    "host": re.compile(r"^\s*host\s*:\s*(\S+)"),
    "exitcode": re.compile(r"^\s*exitcode\s*:\s*(-?\d+)"),
}


@decoder
def childfailed(ev: Event, tc: TimeContext) -> None:
    """torchelastic's per-failure block: rank line plus the time/host/exitcode lines near it."""
    ev.role = Role.context
    ev.tag(Tag.failure_report)
    block = list(ev.line.following)
    for text in block:
        for key, rx in _BLOCK.items():
            m = rx.match(text)
            if m and key not in ev.caps:
                ev.caps[key] = m.group(1)
    if "host" in ev.caps:
        ev.peer = ev.caps["host"]
    if ev.caps.get("rank", "").isdigit():
        ev.rank = int(ev.caps["rank"])
    t = tc.epoch(parse_stamp_text(ev.caps.get("time", "")))
    if t is not None:
        ev.when = t
    code = ev.caps.get("exitcode")
    if code is not None:
        ev.tag(f"exit{code}")
        _first_failure(ev, code)


def _first_failure(ev: Event, code: str) -> None:
    """torchelastic's first observed failure, when nothing else in the job names a cause: a
    SIGKILL is most often the OOM killer, a crash signal or a non-zero exit the program itself.
    SIGABRT (the NCCL watchdog's way out) and SIGTERM (teardown) name nothing."""
    try:
        n = int(code)
    except ValueError:
        return
    if n == -9:
        # SIGKILL points at memory; only the memory record beside it proves it.
        ev.category, ev.action = Category.host_oom, Action.reduce_host_memory
        ev.suggests = True
    elif n > 0 or -n in _CRASH_SIGNALS:
        ev.category, ev.action = Category.application_error, Action.fix_application
    else:
        return
    ev.role = Role.root
    ev.weak = ev.last_resort = True


@decoder
def device_lost(ev: Event, tc: TimeContext) -> None:
    """The GPU is gone from the bus: a lost device explains its own link and ECC errors."""
    ev.tag(Tag.device_lost)


@decoder
def dataloader_worker(ev: Event, tc: TimeContext) -> None:
    """A DataLoader worker killed by SIGKILL is most often the OOM killer at work, and one killed
    by SIGBUS ran out of /dev/shm: host memory, but only when nothing else in the job is a cause
    (the worker also dies when the main process is torn down)."""
    sig = (ev.caps.get("sig") or "").strip().rstrip(".")
    if sig in ("Killed", "Bus error"):
        ev.category, ev.role = Category.host_oom, Role.root
        ev.weak = ev.last_resort = True
        ev.suggests = sig == "Killed"       # SIGKILL points at memory; SIGBUS is /dev/shm
        ev.action = Action.reduce_host_memory

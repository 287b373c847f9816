"""correlate: rank <-> node <-> GPU, hosts and peers named in errors, a rank's exit time; and the
relations between events that change what one of them means (a context line that recasts a
nearby error, an application Xid repeating for several processes on one GPU)."""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from . import public
from .decode import Event, normalize_pci
from .incident import TRUSTED
from .models import Bundle
from .taxonomy import FAMILY, PROGRAM_FAMILIES, RANK_GPU, Action, Category, Fact, Role, Source, Tag


@dataclass
class Links:
    rank_node: dict = field(default_factory=dict)
    rank_gpu: dict = field(default_factory=dict)      # rank -> PCI address
    node_gpu_index: dict = field(default_factory=dict)  # (node, cuda dev) -> PCI address
    rank_exit: dict = field(default_factory=dict)     # rank -> (time, exit code)
    host_node: dict = field(default_factory=dict)     # host name or IP -> node
    pid_rank: dict = field(default_factory=dict)      # (node, pid) -> rank
    gpu_identity: dict = field(default_factory=dict)  # (node, pci) -> {"uuid", "serial"}
    launcher_ranks: set = field(default_factory=set)  # ranks placed by the launcher's own word


def _resolve_host(host: Optional[str], nodes: set) -> Optional[str]:
    if not host:
        return None
    h = host.strip().strip("[]")
    if "<" in h:
        h = h.split("<", 1)[0]
    if h in nodes:
        return h
    short = h.split(".")[0]
    if short in nodes and not short.isdigit():
        return short
    if not nodes and _PLAIN_HOST.match(h) and not _IP.match(h):
        # No node list and no node folders (one job-level log): the host the emitter's own
        # prefix or message names is the only word on where it happened.
        return short
    return None


def correlate(events: list[Event], bundle: Bundle) -> Links:
    job = bundle.job
    nodes = set(job.nodes) | set(bundle.node_dirs)
    L = Links()
    # Hosts named in NCCL line prefixes and torchelastic reports are nodes (or their FQDN).
    for ev in events:
        for h in (ev.caps.get("host"), ev.caps.get("nccl_host")):
            n = _resolve_host(h, nodes)
            if n:
                L.host_node[h] = n
    # rank -> node. The launcher's word (a rank's line in a node folder, torchelastic's failure
    # report, srun's task list) outranks a host name in a line's own text (NCCL's host:pid
    # prefix), which the rank's program prints and could print for any host.
    launcher: dict[int, Counter] = defaultdict(Counter)
    printed: dict[int, Counter] = defaultdict(Counter)
    for ev in events:
        if ev.rank is None:
            continue
        if Tag.failure_report in ev.tags:
            n = _resolve_host(ev.caps.get("host"), nodes)
            if n:
                launcher[ev.rank][n] += 10
        elif ev.line.node:
            launcher[ev.rank][ev.line.node] += 1
        else:
            n = _resolve_host(ev.caps.get("host") or ev.caps.get("nccl_host"), nodes)
            if n:
                printed[ev.rank][n] += 1
    for ev in events:                     # srun: error: <node>: tasks 32-35,37: ...
        if Tag.task_list in ev.tags:
            n = _resolve_host(ev.caps.get("node"), nodes)
            for r in _ranks(ev.caps["tasks"]):
                if n:
                    launcher[r][n] += 5
    for r in sorted(set(launcher) | set(printed)):
        c = launcher.get(r) or printed[r]
        L.rank_node[r] = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    L.launcher_ranks = set(launcher)
    if job.nodes and job.num_tasks and job.tasks_per_node and \
            job.num_tasks == len(job.nodes) * job.tasks_per_node:
        for r in range(job.num_tasks):   # block distribution, only where nothing else said
            L.rank_node.setdefault(r, job.nodes[r // job.tasks_per_node])
    # GPUs: NCCL's ncclCommInitRank line maps rank and CUDA device to a bus id.
    for ev in events:
        if ev.caps.get("busid") and ev.rank is not None:
            pci = normalize_pci(_busid(ev.caps["busid"]))
            L.rank_gpu[ev.rank] = pci
            node = ev.line.node or L.rank_node.get(ev.rank)
            if node and ev.caps.get("dev", "").isdigit():
                L.node_gpu_index[(node, int(ev.caps["dev"]))] = pci
    for ev in events:
        if Tag.failure_report in ev.tags and ev.rank is not None and ev.when is not None:
            L.rank_exit[ev.rank] = (ev.when, ev.caps.get("exitcode"))
    # GPU identity: the kernel's "GPU at PCI:...: GPU-<uuid>" line (and the serial line right
    # after it) and nvidia-smi's serial/UUID fields, per (node, PCI address).
    last_pci: dict = {}
    for ev in sorted((e for e in events if e.rule.fact == Fact.gpu_identity),
                     key=Event.sort_key):
        node = ev.node or ev.line.node
        key_doc = ev.line.doc
        if ev.gpu:
            last_pci[key_doc] = ev.gpu
        pci = ev.gpu or last_pci.get(key_doc)
        if not (node and pci):
            continue
        ident = L.gpu_identity.setdefault((node, pci), {})
        if ev.caps.get("uuid"):
            ident.setdefault("uuid", ev.caps["uuid"])
        if ev.caps.get("serial"):
            ident.setdefault("serial", ev.caps["serial"])
        what, value = ev.caps.get("what", ""), ev.caps.get("value", "")
        if "uuid" in what:
            ident.setdefault("uuid", value)
        elif "serial" in what and value.isdigit() and set(value) != {"0"}:
            ident.setdefault("serial", value)
    lone = _lone_task_failure(events, nodes)
    # Apply: fill node, GPU and time bounds that a single line could not know.
    for ev in events:
        if ev.node is None and ev.rank is None and ev.line.doc in lone and \
                ev.source == Source.stderr and FAMILY.get(ev.category) in PROGRAM_FAMILIES:
            # One job-level stream without rank prefixes, and srun says one task failed: the
            # program's own errors in it came from that task.
            ev.node, ev.rank = lone[ev.line.doc]
        if ev.node is None:
            n = L.rank_node.get(ev.rank) if ev.rank in L.launcher_ranks else None
            n = n or _resolve_host(ev.caps.get("node"), nodes) or \
                _resolve_host(ev.caps.get("nccl_host"), nodes) or \
                _resolve_host(ev.line.tagged_host, nodes)
            named = ev.caps.get("node") or ev.line.tagged_host
            if n is None and _PLAIN_HOST.match(named or "") and (
                    ev.source == Source.scheduler or FAMILY.get(ev.category) in PROGRAM_FAMILIES):
                # Slurm itself names the node, or a launcher's tag does (pdsh). In job output
                # the line could be the user's own text, which is believed only where it
                # cannot take a node out of service.
                n = named
            if n is None and ev.rank is not None:
                n = L.rank_node.get(ev.rank)
            ev.node = n
        if ev.gpu is None and ev.source == Source.stderr and ev.category in RANK_GPU:
            if ev.caps.get("gpu_index", "").isdigit() and ev.node:
                ev.gpu = L.node_gpu_index.get((ev.node, int(ev.caps["gpu_index"])))
            if ev.gpu is None and ev.rank is not None:
                ev.gpu = L.rank_gpu.get(ev.rank)
        if ev.peer:
            n = _resolve_host(ev.peer, nodes) or L.host_node.get(ev.peer.split("<")[0])
            ev.points_at = n
        if ev.rank is not None and ev.rank in L.rank_exit and ev.source == Source.stderr:
            t = L.rank_exit[ev.rank][0] + 1.0
            # A rank's own error came before that rank's process exited.
            if ev.hi is None or ev.hi > t:
                ev.hi = t
    return L


def _lone_task_failure(events: list[Event], nodes: set) -> dict:
    """doc -> (node, rank or None) for a job-level file whose lines carry no rank and in which
    srun reports exactly one task (or task range on one node) exiting with an error code."""
    exits: dict = defaultdict(list)
    ranked = set()
    for ev in events:
        if ev.line.node is None and ev.line.rank is not None:
            ranked.add(ev.line.doc)
        if Tag.exit_code in ev.tags and ev.line.node is None:
            exits[ev.line.doc].append(ev)
    out = {}
    for doc, evs in exits.items():
        where = {(_resolve_host(e.caps.get("node"), nodes) or e.caps.get("node"),
                  e.caps.get("tasks")) for e in evs}
        if doc in ranked or len(where) != 1:
            continue
        node, tasks = where.pop()
        if node and _PLAIN_HOST.match(node):
            out[doc] = (node, int(tasks) if tasks and tasks.isdigit() else None)
    return out


_PLAIN_HOST = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")
_IP = re.compile(r"^(?:\d{1,3}\.){3}\d{1,3}$|^[0-9a-fA-F:]*:[0-9a-fA-F:]*$")


def _busid(b: str) -> str:
    b = b.lower()
    if ":" in b:
        return b
    b = b.rjust(5, "0")        # NCCL prints busId 4e000 = bus 4e, device 00, function 0
    return f"{b[:-3]}:{b[-3:-1]}.{b[-1]}"


def _ranks(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit() and int(b) - int(a) < 100_000:
                out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def recast(events: list[Event]) -> None:
    """Context lines that say what a later error in the same file means (rule `recasts`)."""
    by_doc: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_doc[e.line.doc].append(e)
    for doc in sorted(by_doc):
        evs = sorted(by_doc[doc], key=Event.sort_key)
        for i, ctx in enumerate(evs):
            rc = ctx.rule.recasts
            if rc is None:
                continue
            for e in evs[i + 1:]:
                if e.line.offset - ctx.line.offset > rc.within_bytes:
                    break
                if e.rule.id in rc.rules and e.role == Role.root:
                    if rc.category is not None:
                        e.category = rc.category
                    if rc.role is not None:
                        e.role = rc.role
                    if rc.action != Action.none:
                        e.action = rc.action
                    e.why = rc.why


REPEAT_OCCURRENCES = 3        # the same maybe-hardware Xid on one GPU
REPEAT_PROCESSES = 3


def repeats_across_processes(events: list[Event]) -> None:
    """An application-level Xid (13, 31) that one GPU raised for several unrelated processes,
    and no other GPU of the node did, is that GPU's fault (NVIDIA's Xid 13/31 workflow)."""
    groups: dict[tuple, list[Event]] = defaultdict(list)
    for e in events:
        if Tag.repeat_implicates_gpu in e.tags and e.source in TRUSTED and e.gpu:
            groups[(e.node, e.caps.get("xid"))].append(e)
    for (node, code), evs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        gpus = {e.gpu for e in evs}
        pids = {e.pid for e in evs if e.pid is not None}
        if len(gpus) != 1 or len(pids) < REPEAT_PROCESSES:
            continue
        for e in evs:
            e.category, e.role, e.weak, e.suggests = Category.gpu_hardware, Role.root, False, False
            e.action = Action.reset_gpu
            e.tags = e.tags - {Tag.restart_app}
            e.detail = (f"Xid {code} from {len(pids)} different processes on this GPU only: "
                        "the GPU, not one program")
    # A GPU fault NVIDIA's catalog calls "maybe hardware" that one GPU raises again and again
    # is no passing event: the recurrence backs the single line.
    again: dict[tuple, list[Event]] = defaultdict(list)
    for e in events:
        if e.suggests and Tag.gpu_xid in e.tags and e.source in TRUSTED and e.gpu \
                and e.category != Category.application_error:
            again[(e.node, e.gpu, e.caps.get("xid"))].append(e)
    for evs in again.values():
        if len({e.line.offset for e in evs}) >= REPEAT_OCCURRENCES:
            for e in evs:
                e.suggests = False




def version_skew(events: list[Event]) -> None:
    """A value that must be the same on every node (rule `same_across_nodes`, e.g. the NCCL
    version in each process's banner) but differs: the nodes in the minority are the culprit;
    with no majority, the first line of each version stands, and the verdict sees them all."""
    by_rule: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.rule.same_across_nodes and e.node:
            by_rule[e.rule.id].append(e)
    for rid in sorted(by_rule):
        evs = sorted(by_rule[rid], key=Event.sort_key)
        key = evs[0].rule.same_across_nodes
        kind = evs[0].rule.public[key]          # the summary shows the detail to anyone
        per_node: dict[str, str] = {}
        for e in evs:
            v = e.caps.get(key)
            if v:
                per_node.setdefault(e.node, v)
        counts = Counter(per_node.values())
        if len(counts) < 2:
            continue
        top = max(counts.values())
        majority = {v for v, n in counts.items() if n == top}
        odd = {n for n, v in per_node.items() if len(majority) == 1 and v not in majority} \
            or {n for n in per_node}
        seen = set()
        for e in evs:
            if e.node in odd and e.node not in seen and e.caps.get(key):
                seen.add(e.node)
                e.role, e.category = Role.root, e.rule.category or Category.software_incompat
                e.detail = "; ".join(
                    f"{public.shown(kind, v)} on " + ", ".join(sorted(
                        public.shown("name", n) for n, x in per_node.items() if x == v))
                    for v in sorted(counts))
                e.why = f"{key} differs across the job's nodes"

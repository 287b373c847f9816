"""verdict: what a winning incident recommends, and what the ranks' progress counters say when
nothing names a cause."""
from __future__ import annotations

from typing import Optional

from .correlate import Links
from .decode import Event
from .incident import Incident
from .taxonomy import (BLAME, INFRASTRUCTURE, TRUST, Action, Blame, Category, Fact, Role, Source,
                       Tag, Trust, most_trusted, out_of_service)


def cause_trust(inc: Incident) -> Trust:
    """The most trusted source among the incident's own evidence."""
    return most_trusted(TRUST[e.source] for e in inc.events) or Trust.job_output


def cause_blame(inc: Incident) -> Blame:
    """Whose fault the incident is: what the rule or catalog row of its leading event of its
    category declares for that category, else the category's own blame."""
    for e in inc.events:
        if e.category == inc.category:
            return e.blame[1] if e.blame and e.blame[0] == e.category else BLAME[inc.category]
    return BLAME[inc.category]


def job_blame(outcome, causes: list) -> str:
    """Whose fault the failed job is, as one word a job script or retry wrapper can act on: the
    root cause's blame; for an ambiguous diagnosis the candidates' blame when they all share
    it; else `unknown` (nothing proven, or causes that disagree)."""
    blames = {c.blame for c in causes}
    if outcome != "unattributed" and len(blames) == 1:
        return blames.pop().value
    return "unknown"


def contradicted_by(inc: Incident, events: list[Event]) -> Optional[str]:
    """A second source on the culprit's node that says otherwise, in one line, or None.

    A GPU gone from the bus, as kernel text says, is contradicted when the node's nvidia-smi
    answers for that very GPU (its serial or UUID) and nothing in the node's telemetry agrees
    with the kernel: no GPU lost, no GPU hardware fault or DCGM Xid on it or node-wide, no
    failed probe (what the job printed counts for nothing here). A GPU that fell off the bus
    does not answer again before a reset, so the kernel line is forged (engine/kmsg.py) or
    about another device. With no nvidia-smi record of the GPU the kernel line stands alone."""
    if inc.gpu is None or not any(Tag.device_lost in e.tags for e in inc.events
                                  if e.source == Source.kernel):
        return None
    telemetry = [e for e in events if e.node == inc.node and
                 TRUST[e.source] == Trust.node_telemetry and e.gpu in (inc.gpu, None)]
    answers = [e for e in telemetry if e.source == Source.gpu and e.gpu == inc.gpu
               and e.role == Role.context]
    agrees = [e for e in telemetry if e.source == Source.probe or Tag.device_lost in e.tags
              or e.category == Category.gpu_hardware]
    if not answers or agrees:
        return None
    return (f"nvidia-smi on {inc.node} answers for GPU {inc.gpu} and does not report it lost "
            f"({answers[0].line.doc}:{answers[0].line.line})")


def cause_action(inc: Incident, links: Links) -> tuple[str, Action]:
    text, code = _action(inc, links)
    if cause_trust(inc) != Trust.job_output or not out_of_service(code):
        return text, code
    # Only the job's own output says so: the user controls every byte of it. Name what it
    # says, but never take a node out of service on it.
    node = inc.node or "the node"
    g = f" GPU {inc.gpu}" if inc.gpu else ""
    return (f"inspect {node}{g} before taking it out of service: only the job's output "
            f"reports this {inc.category.value} fault (no kernel, GPU, fabric or scheduler record); "
            "read its kernel log and run DCGM diagnostics (dcgmi diag -r 3)",
            Action.inspect_node)


def _action(inc: Incident, links: Links) -> tuple[str, Action]:
    cat = inc.category
    node = inc.node or "the node"
    gpu = inc.gpu
    g = f" GPU {gpu}" if gpu else ""
    details = [e.detail for e in inc.events if e.role == Role.root and e.detail]
    roots = [e for e in inc.events if e.role == Role.root] or inc.events
    if cat in INFRASTRUCTURE and all(Tag.restart_app in e.tags for e in roots):
        # NVIDIA's catalog: restart the application; the GPU needs no reset or drain for it.
        return (f"restart the job; the GPU stays in service (NVIDIA's action for this Xid). "
                f"If it recurs on{g or ' the same GPU'} of {node}, run DCGM diagnostics "
                "(dcgmi diag -r 3)", Action.resubmit)
    if cat == Category.gpu_hardware:
        if any(Tag.device_lost in e.tags or Tag.reboot_required in e.tags for e in inc.events):
            return (f"drain {node}; reboot it and check{g} (fell off the bus / needs reboot); "
                    "replace the GPU or its slot if it recurs", Action.reboot_node)
        return f"drain {node}; reset{g} and run DCGM diagnostics (dcgmi diag -r 3)", \
            Action.reset_gpu
    if cat == Category.gpu_memory_ecc:
        return (f"drain {node}; reset{g} to apply row remapping; replace the GPU if "
                "remapping failed or errors recur", Action.drain_node)
    if cat in (Category.nvlink, Category.nvswitch_fabric):
        d = f" ({details[0]})" if details else ""
        return f"drain {node}; reset{g} and inspect its NVLink{d}", Action.inspect_nvlink
    if cat == Category.pcie:
        return f"drain {node}; check PCIe link of{g} (reseat, riser, slot)", Action.drain_node
    if cat == Category.thermal_power:
        return f"check cooling and power of {node}{g}", Action.check_cooling_power
    if cat == Category.network_ib:
        return (f"drain {node}; check the cable, transceiver and switch port of the failed "
                "network link", Action.inspect_network_link)
    if cat == Category.network_config:
        return f"fix the network configuration on {node} (interface, GID, RDMA settings)", \
            Action.fix_network_config
    if cat == Category.host_oom:
        r = f" (rank {inc.rank(links)})" if inc.rank(links) is not None else ""
        return (f"the job ran out of host memory on {node}{r}: request more memory (--mem) "
                "or reduce host memory use (dataloader workers, pinned memory)",
                Action.reduce_host_memory)
    if cat == Category.cuda_oom:
        r = f"rank {inc.rank(links)}" if inc.rank(links) is not None else node
        return (f"reduce GPU memory use on {r} (batch size, sequence length, activation "
                "checkpointing) or use more GPUs", Action.reduce_gpu_memory)
    if cat == Category.application_error:
        r = (f"rank {inc.rank(links)} on {node}" if inc.rank(links) is not None
             else inc.node or "the job")
        return f"fix the error raised by {r} (see the evidence) and resubmit", \
            Action.fix_application
    if cat == Category.software_incompat and cause_blame(inc) == Blame.machine:
        return (f"drain {node}; make its driver / CUDA / library versions consistent (reload "
                "the NVIDIA module or reboot after driver updates)", Action.reboot_node)
    if cat == Category.software_incompat:
        return (f"fix the job's software environment on {node}: the CUDA, NCCL and other "
                "libraries it loads must fit the node's driver, each other and the GPU (two "
                "copies of a library in ~/.local or the container, a build for another GPU "
                "architecture)", Action.fix_software)
    if cat == Category.storage_io:
        return (f"check the filesystem seen from {node} (server, OSTs, client eviction); "
                "resubmit from the last good checkpoint", Action.check_storage)
    if cat == Category.scheduler_node_failure:
        return (f"check {node} (Slurm marked it down); resubmit, excluding it until it is "
                "healthy", Action.drain_node)
    if cat == Category.scheduler_timelimit:
        return "resubmit with a longer --time, or checkpoint more often", \
            Action.extend_time_limit
    if cat == Category.scheduler_preemption:
        return "none needed: the job was preempted by a higher-priority job", Action.resubmit
    if cat == Category.scheduler_cancelled:
        return "none needed: the job was cancelled (scancel)", Action.none
    return "inspect the evidence", Action.contact_support


def progress_findings(events: list[Event], links: Links, job) -> tuple[list[str], list]:
    """What the ranks' own progress counters say when nothing names a cause: which ranks
    lagged behind (never reached the collective) and which never reported a timeout."""
    notes: list[str] = []
    enq: dict[int, int] = {}
    for e in events:
        if e.rule.fact == Fact.rank_progress and e.rank is not None and "enq" in e.caps:
            enq[e.rank] = max(enq.get(e.rank, -1), int(e.caps["enq"]))
    suspects = []
    if len(enq) >= 2:
        top = max(enq.values())
        lag = sorted(r for r, v in enq.items() if v < top)
        if lag:
            where = sorted({links.rank_node.get(r) or "?" for r in lag})
            notes.append(f"rank(s) {rank_list(lag)} on {', '.join(where)} lagged: last enqueued "
                         f"NCCL work {min(enq[r] for r in lag)} < {top}; they never reached the "
                         "collective the others waited in")
            suspects = [(r, links.rank_node.get(r)) for r in lag]
        else:
            notes.append(f"all {len(enq)} ranks that reported progress stopped at the same "
                         f"NCCL work ({top}): no rank lagged behind")
    timed_out = {e.rank for e in events if e.rule.fact == Fact.collective_timeout
                 and e.rank is not None}
    world = job.num_tasks or max((int(e.caps["nranks"]) for e in events
                                  if e.caps.get("nranks", "").isdigit()), default=0)
    if world and len(timed_out) >= world // 2 and len(timed_out) < world:
        silent = sorted(set(range(world)) - timed_out)
        notes.append(f"rank(s) {rank_list(silent)} never reported a collective timeout "
                     "(they had exited or were stuck before the others timed out)")
    return notes, suspects


def rank_list(ranks: list[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out[:20]) + (",..." if len(out) > 20 else "")



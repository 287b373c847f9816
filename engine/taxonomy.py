"""Closed vocabularies shared by rules, the pipeline and the diagnosis.

`Category` is the stable list of the diagnosis contract; scoring tools and dashboards depend on
these exact strings. The others are ours, but closed: a rule file naming a value outside them fails
validation.
"""
from enum import Enum
from typing import NamedTuple


class Category(str, Enum):
    gpu_hardware = "gpu_hardware"
    gpu_memory_ecc = "gpu_memory_ecc"
    pcie = "pcie"
    thermal_power = "thermal_power"
    nvlink = "nvlink"
    nvswitch_fabric = "nvswitch_fabric"
    network_ib = "network_ib"
    network_config = "network_config"
    application_error = "application_error"
    cuda_oom = "cuda_oom"
    host_oom = "host_oom"
    software_incompat = "software_incompat"
    storage_io = "storage_io"
    scheduler_timelimit = "scheduler_timelimit"
    scheduler_node_failure = "scheduler_node_failure"
    scheduler_preemption = "scheduler_preemption"
    scheduler_cancelled = "scheduler_cancelled"


FAMILY = {
    Category.gpu_hardware: "gpu", Category.gpu_memory_ecc: "gpu", Category.pcie: "gpu",
    Category.thermal_power: "gpu",
    Category.nvlink: "nvlink", Category.nvswitch_fabric: "nvlink",
    Category.network_ib: "network", Category.network_config: "network",
    Category.application_error: "workload", Category.cuda_oom: "workload",
    Category.host_oom: "workload", Category.software_incompat: "workload",
    Category.storage_io: "storage",
    Category.scheduler_timelimit: "scheduler", Category.scheduler_node_failure: "scheduler",
    Category.scheduler_preemption: "scheduler", Category.scheduler_cancelled: "scheduler",
}

# Families whose faults on a node are one incident with another family's: a lost GPU takes its
# links down, and a link fault surfaces as GPU errors.
INCIDENT_FAMILY = {"nvlink": "gpu"}

# Families of the program's own faults: a line of them in job output may say which node or task
# it came from, since it cannot take a node out of service.
PROGRAM_FAMILIES = {"workload"}

# Families whose cause of last resort explains the others': a process that exited explains a
# peer's "remote process exited or network error".
EXPLAINS_LAST_RESORT = {"workload"}

# Categories a rank's line reports of the GPU it ran on: where the line names no GPU, it is the
# rank's (NCCL's ncclCommInitRank line maps rank to bus id).
RANK_GPU = {Category.cuda_oom, Category.gpu_hardware, Category.gpu_memory_ecc, Category.nvlink}

# Categories that end a job by decision of the scheduler rather than by a fault. Events after
# one of these are teardown; the terminator is the cause only when no fault came before it.
TERMINATORS = {Category.scheduler_timelimit, Category.scheduler_preemption,
               Category.scheduler_cancelled}

# Categories whose trusted events lead their incident: facts about the machine or the system
# (a GPU, link, port, memory, filesystem, the OOM killer) rather than about the user's
# program. They beat the program-side cascades they cause. Which of them are the machine's
# fault is another question: BLAME below.
INFRASTRUCTURE = {Category.gpu_hardware, Category.gpu_memory_ecc, Category.pcie,
                  Category.thermal_power, Category.nvlink, Category.nvswitch_fabric,
                  Category.network_ib, Category.network_config, Category.storage_io,
                  Category.host_oom, Category.software_incompat,
                  Category.scheduler_node_failure}


class Blame(str, Enum):
    """Whose fault a cause is. Only the machine's faults (on trusted evidence: machine_fault)
    count against a node: hotspots, repeat-offender escalation, the drain list and drains."""
    machine = "machine"                    # the node and its parts, its own driver install
    workload = "workload"                  # the job: its code, inputs, memory use, its own
                                           # environment (site-packages, conda, container)
    site_environment = "site_environment"  # shared by every node: filesystems, network settings
    scheduler = "scheduler"                # the scheduler's decision: time limit, preemption


# Each category's blame. A rule or a catalog row may say otherwise for what it matches (the
# NVIDIA driver's own API mismatch is software_incompat and the machine's; a local disk's I/O
# error is storage_io and the machine's): Rule.blame, a row's `blame=` flag.
BLAME = {
    Category.gpu_hardware: Blame.machine, Category.gpu_memory_ecc: Blame.machine,
    Category.pcie: Blame.machine, Category.thermal_power: Blame.machine,
    Category.nvlink: Blame.machine, Category.nvswitch_fabric: Blame.machine,
    Category.network_ib: Blame.machine, Category.network_config: Blame.site_environment,
    Category.application_error: Blame.workload, Category.cuda_oom: Blame.workload,
    Category.host_oom: Blame.workload, Category.software_incompat: Blame.workload,
    Category.storage_io: Blame.site_environment,
    Category.scheduler_timelimit: Blame.scheduler,
    Category.scheduler_node_failure: Blame.machine,
    Category.scheduler_preemption: Blame.scheduler,
    Category.scheduler_cancelled: Blame.scheduler,
}


class Role(str, Enum):
    root = "root"                  # the line names a failing thing: a root-cause candidate
    symptom = "symptom"            # a consequence of something earlier or elsewhere
    confirmation = "confirmation"  # corroborates a root (same node/GPU), never a root alone
    context = "context"            # locator or metadata (rank <-> host <-> GPU, progress counters)


class Source(str, Enum):
    """Where a line came from. Trust follows the source, never the text."""
    kernel = "kernel"        # kernel ring buffer: journal _TRANSPORT=kernel, dmesg, kern.log
    system = "system"        # other system-log lines written by root daemons (networkd, slurmd)
    gpu = "gpu"              # nvidia-smi / NVML snapshot
    dcgm = "dcgm"            # dcgmi health / diag / stats
    ib = "ib"                # ibstat, sysfs port state and counters
    scheduler = "scheduler"  # scontrol, sacct, slurmctld log, slurmstepd/srun lines
    stderr = "stderr"        # rank output: written by the user's program, never trusted as kernel
    probe = "probe"          # sattrib's own probes (a probe that failed or timed out)


class Kind(str, Enum):
    """What an evidence file is, as the reader classified it. What each kind is (its trust,
    file name, how it counts in the completeness report, how it is sniffed and read) is
    declared once, in collectors/sources.py."""
    kernel_log = "kernel_log"            # the kernel/system log as text (journalctl, dmesg, syslog)
    journal_json = "journal_json"        # the journal as `journalctl -o json` records
    nvidia_smi = "nvidia_smi"            # nvidia-smi -q, -q -x, --query-gpu CSV, nvlink, its error
    dcgm = "dcgm"                        # dcgmi health / diag / stats
    ibstat = "ibstat"                    # ibstat, or the sysfs port state and counters
    metrics = "metrics"                  # Prometheus series saved for the job's window
    metrics_failed = "metrics_failed"    # the same file, when its queries failed (a probe line)
    probes = "probes"                    # sattrib's own node probes (sattrib-probes.txt)
    rank_output = "rank_output"          # what the job printed
    flight_recorder = "flight_recorder"  # a rank's PyTorch flight-recorder dump
    flight_recorder_facts = "flight_recorder_facts"   # the facts of them a node shipped
    slurm_job = "slurm_job"              # scontrol show job text
    sacct = "sacct"                      # sacct -P text
    slurm_json = "slurm_json"            # scontrol / sacct --json
    slurm_log = "slurm_log"              # anything else under slurm/ (slurmctld lines)
    run_record = "run_record"            # sattrib's own record of the run (sattrib-run.json)


class Trust(str, Enum):
    """How far a piece of evidence can be believed about the machine: by where it came from."""
    kernel = "kernel"                  # the node's kernel and system log
    node_telemetry = "node_telemetry"  # nvidia-smi, DCGM, InfiniBand state, sattrib's probes
    scheduler = "scheduler"            # Slurm's own records and messages
    job_output = "job_output"          # what the job printed: the user controls every byte


def most_trusted(trusts) -> "Trust | None":
    """The most trusted of these trusts (None of none)."""
    return min(trusts, key=list(Trust).index, default=None)


TRUST = {Source.kernel: Trust.kernel, Source.system: Trust.kernel,
         Source.gpu: Trust.node_telemetry, Source.dcgm: Trust.node_telemetry,
         Source.ib: Trust.node_telemetry, Source.probe: Trust.node_telemetry,
         Source.scheduler: Trust.scheduler, Source.stderr: Trust.job_output}


class Action(str, Enum):
    """Closed set of recommended actions (after gpud's repair actions and NVIDIA's buckets)."""
    none = "none"
    resubmit = "resubmit"                    # transient or scheduler-driven: run the job again
    fix_application = "fix_application"      # a bug or bad input on the user side
    reduce_gpu_memory = "reduce_gpu_memory"
    reduce_host_memory = "reduce_host_memory"
    extend_time_limit = "extend_time_limit"
    reset_gpu = "reset_gpu"
    reboot_node = "reboot_node"
    drain_node = "drain_node"                # take the node out of service and inspect it
    inspect_node = "inspect_node"            # check the node before taking it out of service
    inspect_nvlink = "inspect_nvlink"
    inspect_network_link = "inspect_network_link"
    fix_network_config = "fix_network_config"
    check_storage = "check_storage"
    fix_software = "fix_software"            # driver / library / firmware mismatch
    check_cooling_power = "check_cooling_power"
    collect_evidence = "collect_evidence"    # nothing conclusive: collect what was missing
    contact_support = "contact_support"


class Service(NamedTuple):
    """What an action asks of the node's service."""
    out_of_service: bool   # the node must be emptied first: the drain policy and list act on it
    rank: int              # its step on the escalation ladder (0: the node stays in service)


SERVICE = {
    Action.none: Service(False, 0), Action.resubmit: Service(False, 0),
    Action.fix_application: Service(False, 0), Action.reduce_gpu_memory: Service(False, 0),
    Action.reduce_host_memory: Service(False, 0), Action.extend_time_limit: Service(False, 0),
    Action.inspect_node: Service(False, 0), Action.fix_network_config: Service(False, 0),
    Action.check_storage: Service(False, 0), Action.fix_software: Service(False, 0),
    Action.check_cooling_power: Service(False, 0), Action.collect_evidence: Service(False, 0),
    Action.contact_support: Service(False, 0),
    # A GPU reset needs the GPU idle; an NVLink or a network link is inspected and its cable or
    # transceiver reseated with the node empty: each begins with a drain.
    Action.reset_gpu: Service(True, 1), Action.inspect_nvlink: Service(True, 1),
    Action.inspect_network_link: Service(True, 1),
    Action.reboot_node: Service(True, 2),
    Action.drain_node: Service(True, 3),     # out of service until hardware service
}
# The closed escalation ladder, one action per rank from 1: repeat offenders climb it.
LADDER = (Action.reset_gpu, Action.reboot_node, Action.drain_node)


def out_of_service(code) -> bool:
    """Whether the action code (an Action or its value) takes the node out of service."""
    try:
        return SERVICE[Action(code)].out_of_service
    except ValueError:
        return False


def ladder_rank(code) -> int:
    try:
        return SERVICE[Action(code)].rank
    except ValueError:
        return 0


def blame_of(category, declared=None) -> Blame:
    """A cause's blame: what its diagnosis declares, else its category's (a diagnosis made
    before causes carried one)."""
    return Blame(declared) if declared else BLAME[Category(category)]


def machine_fault(blame, trust) -> bool:
    """The machine's fault: blamed on the machine, on evidence the job did not write. The one
    predicate behind hotspots, `list --infra`, escalation, drains and the drain list."""
    return Blame(blame) == Blame.machine and Trust(trust) != Trust.job_output


# Families whose faults are a GPU's own (its board, memory, PCIe link, NVLink).
GPU_FAMILIES = {"gpu", "nvlink"}


def fault(blame, trust) -> str | None:
    """Whose fault a root cause is, in the words the dashboard's node and GPU pages use (the
    stored `fault` column): `infrastructure` for the machine's fault, `unconfirmed` when only
    the job's output blames the machine, else its blame. None without a cause."""
    if not blame:
        return None
    if trust and machine_fault(blame, trust):
        return "infrastructure"
    return "unconfirmed" if Blame(blame) == Blame.machine else Blame(blame).value


def gpu_fault(category, blame, trust) -> bool:
    """A fault of the GPU itself: the machine's fault in a GPU family. What GPU hotspots count
    (the stored `gpu_fault` column)."""
    return fault(blame, trust) == "infrastructure" and FAMILY[Category(category)] in GPU_FAMILIES


class Outcome(str, Enum):
    attributed = "attributed"
    ambiguous = "ambiguous"
    unattributed = "unattributed"


class Fact(str, Enum):
    """What a later stage reads a rule's hits as, beyond a cause: a closed set a rule names
    with `fact:`, so the stages ask for the fact, never for a rule id."""
    gpu_identity = "gpu_identity"            # a GPU's UUID or serial beside its bus address
    probe_failed = "probe_failed"            # one of sattrib's own node probes failed
    rank_progress = "rank_progress"          # a rank's NCCL work counters (enqueued, completed)
    collective_timeout = "collective_timeout"   # a rank's watchdog saw a collective time out
    desync_report = "desync_report"          # PyTorch's report of the ranks that lagged
    flight_recorder = "flight_recorder"      # a rank's flight-recorder dump, one process group
    peer_dead = "peer_dead"                  # NCCL RAS declared a peer dead
    util_fell_first = "util_fell_first"      # a GPU went idle before the rest of the job's


class Tag(str, Enum):
    """What the stages mark on an event for each other (names equal values, so a Tag compares
    and hashes like its string). Numbered labels (xid31, signal9, exit-9, ibstatus12,
    link4, nvl5:<bucket>) stay plain strings: they only describe, no stage reads them."""
    teardown = "teardown"                    # printed while the job was being torn down
    device_lost = "device_lost"              # the GPU is gone from the bus
    reboot_required = "reboot_required"      # the driver's recovery action (Xid 154): reboot
    bare_cancel = "bare_cancel"              # a cancel banner without a reason
    cancel_record = "cancel_record"          # the scheduler's record of who cancelled
    channel_teardown = "channel_teardown"    # Xid 45: the driver tore channels down
    restart_app = "restart_app"              # NVIDIA's action: restart the application
    repeat_implicates_gpu = "repeat_implicates_gpu"   # Xid 13/31: repeats point at the GPU
    sympathetic = "sympathetic"              # a link error reported by the healthy end
    task_exit = "task_exit"
    task_killed = "task_killed"              # srun reports a task killed (SIGKILL): teardown
    exit_code = "exit_code"
    gpu_xid = "gpu_xid"                      # an Xid as the driver (or DCGM) reports it
    failure_report = "failure_report"        # the launcher's report of a failed rank: host,
                                             # time and exit code (torchelastic)
    task_list = "task_list"                  # srun names the node the listed tasks ran on

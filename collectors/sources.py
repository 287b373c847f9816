"""Every evidence source and every file sattrib writes into a bundle, declared once.

One row per kind of evidence file (engine.taxonomy.Kind) and per manifest file: what it is and
how far its lines are believed (`trust`), the names sattrib gives it in a bundle, how it counts
in the diagnosis' completeness report, which node probes stand for it, its label in the "Read N
files" line, how a file is recognised as one (`sniff`), how it is read (`read`, `parse`) and how
a node's Epilog takes it (`take`). The evidence-folder reader classifies and reads by these
rows, the node snapshot takes by them, the completeness report counts by them, and the probe
record, the hook-health columns and the reading summary name sources by them.

Adding a source: its collector module (sniff, parse, take), its row here, its Kind, its rules.
Manifest rows (kind None) are files of sattrib's own that are never evidence: the diagnosis and
the actions taken on it must not be read back as what the job printed when a kept bundle is
replayed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional

from ..engine.models import Counting
from ..engine.taxonomy import Kind, Source
from . import dcgm, flight_recorder, ibstat, kernel_log, nvidia_smi, probes_file, prometheus, \
    slurm_state


class Where(str, Enum):
    """Where in an evidence folder a row's files are."""
    node = "node"        # a node's folder (or a lone node's folder handed in on its own)
    slurm = "slurm"      # slurm/: the scheduler's records
    top = "top"          # the folder itself


class Read(str, Enum):
    """How the reader reads a kind (collectors/evidence_folder.py, one method each)."""
    skip = "skip"              # a manifest: not read
    notes = "notes"            # a manifest read into the diagnosis' notes
    scan = "scan"              # line by line, the rules on the lines the prefilter finds
    facts = "facts"            # structured: `parse(text)` gives (line, as printed, fact) lines
    record = "record"          # a scheduler record: Slurm's own fields, then line by line
    metrics = "metrics"        # Prometheus series (collectors/prometheus.py)
    dump = "dump"              # a flight-recorder dump, read in a child process
    dump_facts = "dump_facts"  # the flight-recorder facts a node shipped


@dataclass(frozen=True)
class Row:
    kind: Optional[Kind]                 # None: a manifest file, never evidence
    where: Where
    trust: Optional[Source] = None       # the source (and so the trust) of its lines
    files: tuple[str, ...] = ()          # the names sattrib gives it in a bundle
    counts: Optional[Counting] = None    # how it counts in the completeness report
    probes: tuple[str, ...] = ()         # node probes whose failure leaves it missing
    label: str = ""                      # in "Read N files (...: 3 kernel log, ...)"
    sniff: Optional[Callable[[str, bytes, str], bool]] = None   # (name, head, head text)
    read: Read = Read.scan
    parse: Optional[Callable] = None     # for Read.facts: text -> (line, shown, fact)
    take: Optional[Callable] = None      # how a node's Epilog takes it: ctx -> {name: text}


def _named(*names: str) -> Callable[[str, bytes, str], bool]:
    return lambda name, head, text: name in names


def _dump(want: str) -> Callable[[str, bytes, str], bool]:
    return lambda name, head, text: flight_recorder.sniff(name, head) == want


def _record(want: str) -> Callable[[str, bytes, str], bool]:
    return lambda name, head, text: slurm_state.record_kind(text) == want


# Rank output by its name (`*.stderr *.err *.out rank-*`): job output whatever it holds.
RANK_NAME = re.compile(r"(?:^rank[-_.]?\d+|stderr|stdout|\.(?:err|out)(?:\.\d+)?(?:\.gz)?$)",
                       re.I)
KERNEL = Counting("kernel", required=True)
GPU = Counting("gpu", required=True)
OUTPUT = Counting("output", required=True)
FLIGHT = Counting("flight_recorder")
SCHEDULER = Counting("scheduler", per="job", required=True)

# In the order a file is recognised: the first row whose sniff says yes (a node file no row
# takes is rank output, a file under slurm/ a scheduler log).
ROWS = (
    # sattrib's own, never evidence
    Row(None, Where.top, files=("diagnosis.json",), read=Read.skip),
    Row(None, Where.top, files=("actions.json",), read=Read.skip),
    Row(None, Where.top, files=("expected.json",), read=Read.skip),   # a scored case's answer
    Row(None, Where.slurm, files=("collect-notes.txt",), read=Read.notes),
    # the scheduler's records, and sattrib's own record of the run (not the scheduler's)
    Row(Kind.run_record, Where.slurm, Source.scheduler, files=("sattrib-run.json",),
        label="scheduler", sniff=_named("sattrib-run.json"), read=Read.record),
    Row(Kind.slurm_json, Where.slurm, Source.scheduler, counts=SCHEDULER, label="scheduler",
        sniff=_record("slurm_json"), read=Read.record),
    Row(Kind.sacct, Where.slurm, Source.scheduler, counts=SCHEDULER, label="scheduler",
        sniff=_record("sacct"), read=Read.record),
    Row(Kind.slurm_job, Where.slurm, Source.scheduler, counts=SCHEDULER, label="scheduler",
        sniff=_record("slurm_job"), read=Read.record),
    Row(Kind.slurm_log, Where.slurm, Source.scheduler, counts=SCHEDULER, label="scheduler",
        sniff=lambda name, head, text: True),
    # a node's files
    Row(Kind.flight_recorder, Where.node, Source.stderr, counts=FLIGHT,
        label="flight recorder", sniff=_dump("dump"), read=Read.dump),
    Row(Kind.flight_recorder_facts, Where.node, Source.stderr,
        files=(flight_recorder.FACTS_NAME,), counts=FLIGHT, label="flight recorder",
        sniff=_dump("facts"), read=Read.dump_facts),
    Row(Kind.rank_output, Where.node, Source.stderr, counts=OUTPUT, label="job output",
        sniff=lambda name, head, text: bool(RANK_NAME.search(name))),
    Row(Kind.probes, Where.node, Source.probe, files=(probes_file.NAME,), label="probe",
        sniff=_named(probes_file.NAME), read=Read.facts, parse=probes_file.facts),
    Row(Kind.metrics, Where.node, Source.gpu, files=(prometheus.METRICS_NAME,),
        counts=Counting("metrics"), probes=(prometheus.PROBE_NAME,), label="metrics",
        sniff=_named(prometheus.METRICS_NAME), read=Read.metrics),
    Row(Kind.nvidia_smi, Where.node, Source.gpu, files=nvidia_smi.FILES, counts=GPU,
        probes=(nvidia_smi.PROBE,), label="nvidia-smi",
        sniff=lambda name, head, text: nvidia_smi.sniff(text) is not None,
        read=Read.facts, parse=nvidia_smi.facts, take=nvidia_smi.take),
    Row(Kind.ibstat, Where.node, Source.ib, files=(ibstat.NAME,), counts=Counting("ib"),
        label="ibstat", sniff=lambda name, head, text: ibstat.sniff(text),
        read=Read.facts, parse=ibstat.facts, take=ibstat.take),
    Row(Kind.dcgm, Where.node, Source.dcgm, files=(dcgm.NAME,), counts=Counting("dcgm"),
        probes=(dcgm.PROBE,), label="DCGM", sniff=lambda name, head, text: dcgm.sniff(text),
        take=dcgm.take),
    Row(Kind.journal_json, Where.node, Source.kernel, files=(kernel_log.JOURNAL_NAME,),
        counts=KERNEL, probes=(kernel_log.JOURNAL_PROBE,), label="kernel log",
        sniff=lambda name, head, text: kernel_log.is_journal_json(text), take=kernel_log.take),
    Row(Kind.kernel_log, Where.node, Source.kernel, files=(kernel_log.DMESG_NAME,),
        counts=KERNEL, probes=(kernel_log.DMESG_PROBE,), label="kernel log",
        sniff=lambda name, head, text: kernel_log.sniff(name, text)),
    # not sniffed: a metrics file whose queries failed, as Read.metrics finds it
    Row(Kind.metrics_failed, Where.node, Source.gpu, label="metrics"),
)
BY_KIND = {r.kind: r for r in ROWS if r.kind is not None}
# What is not a node under the evidence folder: the scheduler's and the job's folders, and the
# manifests at its top.
RESERVED = frozenset({"slurm", "logs"} | {f for r in ROWS if r.kind is None
                                          and r.where == Where.top for f in r.files})
# What a person leaves beside the evidence (`README*`, `NOTES*`, `*.md`): words about the
# failure, perhaps its answer, never what a machine or the job printed. Not read, wherever it is.
PERSONS_NOTE = re.compile(r"^(?:readme|notes)|\.md$", re.I)
COUNTING = {r.kind: r.counts for r in ROWS if r.kind is not None and r.counts is not None}
# Sources a node's Epilog snapshot delivers: one of them present means the snapshot came.
SNAPSHOT_SOURCES = tuple(dict.fromkeys(BY_KIND[k].counts.name for k in BY_KIND
                                       if BY_KIND[k].take is not None))


def classify(name: str, head: bytes, where: Where) -> Row:
    """The row a file is read by: a manifest's by its name, evidence by its sniff (a node's
    file that no row takes is job output)."""
    text = head.decode("utf-8", "replace")
    for r in ROWS:
        if r.where != where:
            continue
        if r.kind is None:
            if name in r.files:
                return r
        elif r.sniff is not None and r.sniff(name, head, text):
            return r
    return BY_KIND[Kind.rank_output]


def manifest(rel: str) -> Optional[Row]:
    """The manifest row of a bundle path (`actions.json`, `slurm/collect-notes.txt`), if any."""
    folder, _, name = rel.rpartition("/")
    where = Where.top if not folder else Where.slurm if folder == "slurm" else None
    return next((r for r in ROWS if r.kind is None and r.where == where and name in r.files),
                None)


def source_of_probe(probe: str) -> str:
    """The completeness source a node probe stands for (`journalctl` -> kernel)."""
    return next((r.counts.name for r in ROWS if probe in r.probes and r.counts), probe)


def label(kind: Kind) -> str:
    return BY_KIND[kind].label


def takes() -> list[Row]:
    """The rows a node's Epilog takes, the kernel log first: when the budget runs short it is
    the evidence that matters most."""
    rows = [r for r in ROWS if r.take is not None]
    return sorted(rows, key=lambda r: r.counts is not KERNEL)


def kernel_files() -> frozenset:
    """The names a node's kernel log has in a bundle (kept from the job's user: on a shared
    node even the job's window names other users' tasks and files)."""
    return frozenset(f for r in ROWS if r.counts is KERNEL for f in r.files)

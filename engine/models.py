"""Data shapes: the rule file, the inputs the pipeline reads, and the diagnosis it writes.

`Rule` and `Diagnosis` are pydantic models (strict: unknown fields are errors). The pipeline's
inputs (`Document`, `Line`, `JobInfo`) are plain dataclasses: collectors make thousands of them
and they never cross a trust boundary as untyped data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .taxonomy import Action, Category, Outcome, Role, Source, Trust

# --------------------------------------------------------------------------------------------
# Rules (engine/rules/<domain>/<mechanism>.yaml)
# --------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class MatchExample(_Strict):
    line: str
    captures: dict[str, str] = Field(default_factory=dict)


class NoMatchExample(_Strict):
    line: str


class Examples(_Strict):
    match: list[MatchExample] = Field(min_length=1)
    no_match: list[NoMatchExample] = Field(default_factory=list)


class Recast(_Strict):
    """A context line that changes what a nearby later error means: a traceback frame of a
    shared-memory semaphore makes the ENOSPC raised under it host memory, not a disk."""
    rules: list[str] = Field(min_length=1)   # ids of the rules whose hits it recasts
    category: Optional[Category] = None      # what they become (None: keep theirs)
    role: Optional[Role] = None
    action: Action = Action.none
    within_bytes: int = Field(default=4096, ge=1, le=65536)   # how far after it, same file
    why: str


class Rule(_Strict):
    """One failure pattern: what a line means. Which hit is the root cause is engine code."""
    id: str = Field(pattern=r"^[a-z0-9_]+\.[a-z0-9_]+$")
    title: str
    category: Optional[Category] = None      # None only for pure context/locator rules
    role: Role
    source: list[Source] = Field(min_length=1)  # sources a line must come from to count
    pattern: str
    ignore_case: bool = False
    explain: str                             # template over captures, {node} {rank} {gpu}
    action: Action = Action.none
    # Engine hook that refines the hit (e.g. "xid" applies the Xid catalog). Names a function
    # in engine.decode; the rule says what the line is, the decoder adds what the catalog knows.
    decode: Optional[str] = None
    # A generic catch-all (e.g. any Python exception): dropped on a line that a specific rule
    # also matched.
    fallback: bool = False
    # The catch-all of last resort (any Python exception): dropped on a line that any other
    # rule matched, a fallback family rule (CUDA error text, NCCL WARN) included.
    catch_all: bool = False
    # Lines after the hit handed to the decoder (multi-line blocks such as torchelastic's
    # "Root Cause" report). At most 8.
    lines_after: int = Field(default=0, ge=0, le=8)
    # A root only when nothing else in the job is one (a task's bare exit code, a reasonless
    # cancel banner, a network error with no crash anywhere): the cause of last resort.
    last_resort: bool = False
    # Families (gpu, nvlink, network, storage, workload) whose trusted incident on the same node
    # explains this line: a CUDA error on a node whose GPU fell off the bus is that GPU's fault.
    explained_by: list[str] = Field(default_factory=list)
    # Name of the capture a message catalog (engine/catalogs/*.tsv) is matched against; the
    # whole message when the rule has no such capture.
    catalog_key: str = "msg"
    recasts: Optional[Recast] = None
    # Name of a capture that must be the same on every node of a job (a library or driver
    # version): where it differs, the odd node's line becomes a root of the rule's category.
    same_across_nodes: Optional[str] = None
    references: list[str] = Field(default_factory=list)
    examples: Examples

    @field_validator("source", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v


# --------------------------------------------------------------------------------------------
# Pipeline inputs (produced by collectors, consumed by engine.pipeline)
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Document:
    """One evidence file (or one command's output) and what the reader learnt about it."""
    path: str                    # relative to the bundle, '/'-separated: "node-02/journal.log"
    node: Optional[str]          # None for job-level files (logs/, slurm/)
    kind: str                    # kernel_log, journal_json, nvidia_smi, rank_output, ...
    source: Source
    size: int = 0
    truncated_bytes: int = 0     # bytes skipped between head and tail (0 = read whole)
    notes: list[str] = field(default_factory=list)
    year: Optional[int] = None   # year used for timestamps that carry none


@dataclass(slots=True)
class Line:
    """A line that some rule's literal prefilter hit, with its provenance."""
    doc: str                     # Document.path
    line: Optional[int]          # 1-based, counting LF; None past a cut (see offset)
    offset: int                  # byte offset of the line start in the file
    source: Source
    node: Optional[str]
    rank: Optional[int]
    message: str                 # the line without its log prefixes (what rules match)
    prefix: str = ""             # the prefixes peeled off it (text = prefix + message)
    shown: Optional[str] = None  # the original line when it is not prefix + message (facts)
    ts: Optional[float] = None   # epoch seconds (UTC) from the line itself
    ts_res: float = 1.0          # resolution of ts in seconds
    after: Optional[float] = None   # untimed line: printed after this time (same stream)
    before: Optional[float] = None  # untimed line: printed before this time (same stream)
    cursor: Optional[str] = None    # journal cursor when read from the journal
    candidates: Optional[tuple[str, ...]] = None  # rule ids whose literal hit; None = all
    following: tuple[str, ...] = ()  # next lines, for rules with lines_after
    # What the reader's own search of the candidate rules found, for each candidate that
    # matched: rule id -> (captured groups that took part, index of the rule's message-catalog
    # row that classifies the hit or None). None: extract searches itself.
    found: Optional[dict[str, tuple[dict[str, str], Optional[int]]]] = None
    # A metric line (collectors/prometheus.py): what the evidence shows of its series
    # (the fields of Metric below).
    metric: Optional[dict] = None

    @property
    def text(self) -> str:
        """The line as printed (control characters made visible). Kept as prefix + message:
        a big job holds many lines, and most of each one is its message."""
        return self.shown if self.shown is not None else self.prefix + self.message

    def __reduce__(self):
        # The forked readers send tens of thousands of lines: pickled as the field values in
        # order, a line is smaller and loads several times faster than as per-slot state.
        return (Line, tuple(getattr(self, f) for f in _LINE_FIELDS))


_LINE_FIELDS = tuple(Line.__dataclass_fields__)


@dataclass(slots=True)
class JobInfo:
    """Scheduler facts about the job run, from slurm/ files or the controller."""
    job_id: Optional[str] = None
    restart: int = 0
    cluster: Optional[str] = None
    name: Optional[str] = None
    user: Optional[str] = None
    partition: Optional[str] = None
    state: Optional[str] = None
    reason: Optional[str] = None
    exit_code: Optional[str] = None
    start: Optional[float] = None
    end: Optional[float] = None
    nodes: list[str] = field(default_factory=list)
    num_tasks: Optional[int] = None
    tasks_per_node: Optional[int] = None
    batch_host: Optional[str] = None
    own_run: bool = False          # sattrib's own record of a collected run


@dataclass
class Bundle:
    """Everything collected for one job run: the input of the pipeline."""
    name: str
    job: JobInfo
    documents: list[Document] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    node_dirs: list[str] = field(default_factory=list)   # nodes that delivered anything
    notes: list[str] = field(default_factory=list)       # what the collectors could not read


# --------------------------------------------------------------------------------------------
# The diagnosis: a stable contract (README "The diagnosis JSON"); fields may be added, not changed
# --------------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Metric(_Out):
    """What a metric's evidence line is about: its series and labels, the values at the start
    and end of the window, the Prometheus graph of its query for the window, and the samples
    around the change (epoch seconds, value; at most METRIC_POINTS) for a small chart."""
    series: str
    labels: dict[str, str]
    start: float
    end: float
    graph: Optional[str] = None
    points: list[tuple[float, float]] = Field(default_factory=list)


METRIC_POINTS = 60


class Evidence(_Out):
    id: str
    role: Role
    source: Source
    trust: Trust
    node: Optional[str]
    path: str
    line: Optional[int]
    timestamp: Optional[str]
    text: str
    rule: str
    rank: Optional[int] = None
    gpu: Optional[str] = None
    category: Optional[Category] = None
    offset: Optional[int] = None
    cursor: Optional[str] = None
    root: Optional[str] = None     # for symptoms/confirmations: the root evidence id they follow
    metric: Optional[Metric] = None   # for metric lines (from Prometheus): the series behind it


class Cause(_Out):
    category: Category
    node: Optional[str]
    gpu: Optional[str]
    gpu_uuid: Optional[str] = None
    gpu_serial: Optional[str] = None
    rank: Optional[int]
    summary: str
    first_seen: Optional[str]
    evidence: list[str]
    rule: str
    action: str
    action_code: Action
    trust: Trust          # the most trusted source among the cause's own evidence


class Symptom(_Out):
    category: str
    node: Optional[str]
    rank: Optional[int]
    summary: str
    evidence: list[str]
    count: int = 1
    nodes: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    rule: str = ""


class Completeness(_Out):
    present: list[str]
    missing: list[str]
    notes: list[str] = Field(default_factory=list)
    failed_probes: list[str] = Field(default_factory=list)   # "nvidia-smi:node02 timed out"


class JobSummary(_Out):
    cluster: Optional[str] = None
    name: Optional[str] = None
    user: Optional[str] = None
    partition: Optional[str] = None
    state: Optional[str] = None
    reason: Optional[str] = None
    exit_code: Optional[str] = None
    start: Optional[str] = None
    end: Optional[str] = None
    nodes: list[str] = Field(default_factory=list)


class Diagnosis(_Out):
    job_id: Optional[str]
    restart: int = 0
    outcome: Outcome
    root_cause: Optional[Cause]
    candidates: list[Cause]
    affected_nodes: list[str]
    symptoms: list[Symptom]
    evidence: list[Evidence]
    completeness: Completeness
    action: str
    action_code: Action
    explanation: str
    order_note: Optional[str] = None
    job: JobSummary = Field(default_factory=JobSummary)
    rules_version: str
    engine_version: str

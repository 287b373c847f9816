"""Data shapes: the rule file, the inputs the pipeline reads, and the diagnosis it writes.

All plain dataclasses: collectors make thousands of the pipeline's inputs (`Document`, `Line`,
`JobInfo`), and the diagnosis is built on every analysis, where importing pydantic would cost a
third of the start time. Rule files are validated by pydantic in engine/rule_spec.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from .taxonomy import Action, Blame, Category, Kind, Outcome, Role, Source, Trust

# --------------------------------------------------------------------------------------------
# Rules (engine/rules/<domain>/<mechanism>.yaml)
# --------------------------------------------------------------------------------------------


# The rule file's schema is engine/rule_spec.py (pydantic, used when the rule cache misses);
# the engine reads a loaded rule through the plain record it becomes there.


class Record:
    """A validated model as read-only attributes (nested models become records). The fields
    live in the instance dict: the engine reads a rule's fields for every hit line."""

    def __init__(self, fields: dict):
        self.__dict__.update(fields)

    def __setattr__(self, name, value):
        raise AttributeError("a rule is read-only")

    def __eq__(self, other):
        return isinstance(other, Record) and self.__dict__ == other.__dict__

    def __hash__(self):
        return hash(self.__dict__.get("id"))

    def __repr__(self):
        return f"Record({self.__dict__.get('id', '')!r})"


# --------------------------------------------------------------------------------------------
# Pipeline inputs (produced by collectors, consumed by engine.pipeline)
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Document:
    """One evidence file (or one command's output) and what the reader learnt about it."""
    path: str                    # relative to the bundle, '/'-separated: "node-02/journal.log"
    node: Optional[str]          # None for job-level files (logs/, slurm/)
    kind: Kind
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
    tagged_host: Optional[str] = None   # the host its launcher's tag names (pdsh): job output
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
    # What the controller saw of each node's Epilog snapshot (from its own record of the run):
    # (node, state, reason), state `present`, `missing` or `not_due`.
    snapshots: list[tuple[str, str, Optional[str]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Counting:
    """How the documents of one kind count in the completeness report, as the evidence reader's
    registry declares it (collectors/sources.py)."""
    name: str                # the source in `present` / `missing`: kernel, gpu, output, ...
    per: str = "node"        # "node": counted per node (a job-level one, as under logs/, counts
                             # for the job and stands for every node); "job": for the job only
    required: bool = False   # missing where there is none


@dataclass
class Bundle:
    """Everything collected for one job run: the input of the pipeline."""
    name: str
    job: JobInfo
    documents: list[Document] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    node_dirs: list[str] = field(default_factory=list)   # nodes that delivered anything
    notes: list[str] = field(default_factory=list)       # what the collectors could not read
    counting: dict[Kind, Counting] = field(default_factory=dict)   # from the reader's registry


# --------------------------------------------------------------------------------------------
# The diagnosis: a stable contract (README "The diagnosis JSON"); fields may be added, not changed
# --------------------------------------------------------------------------------------------


class _Out:
    """The pydantic methods the callers use, on plain dataclasses: a diagnosis is built on every
    analysis, and importing pydantic for it would cost a third of the start time. Output is what
    pydantic wrote: fields in declaration order, enums by value, UTF-8 kept as it is."""

    def model_dump(self, mode: str = "python") -> dict:
        return _dump(self, mode == "json")

    def model_dump_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(_dump(self, True), indent=indent, ensure_ascii=False,
                          separators=None if indent is not None else (",", ":"))

    def model_copy(self, update: Optional[dict] = None):
        return dataclasses.replace(self, **(update or {}))

    @classmethod
    def model_validate(cls, data: dict):
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _load(hints[k], v) for k, v in data.items()})

    @classmethod
    def model_validate_json(cls, text: str):
        return cls.model_validate(json.loads(text))


def _dump(v, as_json: bool):
    if isinstance(v, _Out):
        return {f.name: _dump(getattr(v, f.name), as_json) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_dump(x, as_json) for x in v]
    if isinstance(v, Enum) and as_json:
        return v.value
    if isinstance(v, float) and as_json and not math.isfinite(v):
        return None                               # JSON has no NaN or infinity
    return v


def _load(hint, v):
    """A JSON value as the field's type: nested models, enums, optionals and lists of them."""
    if v is None:
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is list:
        return [_load(args[0], x) for x in v]
    if args and typing.get_origin(hint) is not list:       # Optional[X]
        return _load(args[0], v)
    if isinstance(hint, type) and issubclass(hint, _Out):
        return hint.model_validate(v)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(v)
    return v


_out = dataclass(kw_only=True)


@_out
class Metric(_Out):
    """What a metric's evidence line is about: its series and labels, the values at the start
    and end of the window, the Prometheus graph of its query for the window, and the samples
    around the change (epoch seconds, value; at most METRIC_POINTS) for a small chart."""
    series: str
    labels: dict[str, str]
    start: float
    end: float
    graph: Optional[str] = None
    points: list[tuple[float, float]] = field(default_factory=list)


METRIC_POINTS = 60


@_out
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
    because: Optional[str] = None  # why the line counts otherwise than its rule alone says


@_out
class Frame(_Out):
    """One frame of the user's own code in the Python traceback above the error line."""
    file: str
    line: int
    function: str
    # the innermost frame: the innermost exception line, when the error line re-raised it
    # (a DataLoader worker's, a chained cause); the user's text, shown where evidence is
    exception: Optional[str] = None


@_out
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
    blame: Blame          # whose fault: machine, workload, site_environment, scheduler
    user_frames: list[Frame] = field(default_factory=list)   # innermost first
    # A second source on the culprit's node that says otherwise (verdict.contradicted_by).
    contradicted_by: Optional[str] = None


@_out
class Symptom(_Out):
    category: str
    node: Optional[str]
    rank: Optional[int]
    summary: str
    evidence: list[str]
    count: int = 1
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    rule: str = ""


@_out
class SourceState(_Out):
    """One fact of the completeness report, typed: what `present`, `missing` and
    `failed_probes` say as strings, and whether each node's Epilog snapshot came."""
    source: str                   # kernel, gpu, output, ..., scheduler; snapshot
    node: Optional[str]           # None: the job's (scheduler, job-level output)
    state: str                    # present | missing | probe_failed | not_due (no snapshot due)
    probe: Optional[str] = None   # the node probe that failed (or that left it missing)
    reason: Optional[str] = None


@_out
class Completeness(_Out):
    present: list[str]
    missing: list[str]
    notes: list[str] = field(default_factory=list)
    failed_probes: list[str] = field(default_factory=list)   # "nvidia-smi:node02 timed out"
    entries: list[SourceState] = field(default_factory=list)


@_out
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
    nodes: list[str] = field(default_factory=list)


@_out
class Localization(_Out):
    """Where the job stopped, even when nothing says why (engine/localize.py): the ranks the
    others waited for and their nodes, in one line, on evidence ids."""
    ranks: list[int]
    nodes: list[str]
    how: str
    evidence: list[str]


@_out
class Diagnosis(_Out):
    job_id: Optional[str]
    restart: int = 0
    outcome: Outcome
    # Whose fault the job's failure is (verdict.job_blame): a Blame value, or "unknown"
    blame: str = "unknown"
    root_cause: Optional[Cause]
    candidates: list[Cause]
    # unattributed: causes the evidence points at without proving them (their lines only
    # suggest them, nothing backs them); empty otherwise
    possible: list[Cause] = field(default_factory=list)
    localization: Optional[Localization] = None
    affected_nodes: list[str]
    symptoms: list[Symptom]
    evidence: list[Evidence]
    completeness: Completeness
    action: str
    action_code: Action
    explanation: str
    order_note: Optional[str] = None
    job: JobSummary = field(default_factory=JobSummary)
    rules_version: str
    engine_version: str

"""The rule file's schema (engine/rules/<domain>/<mechanism>.yaml), validated by pydantic.

Only a rule-cache miss imports this module: a validated rule becomes a `Record` (plain
attributes, hashable, picklable without pydantic), which is what the engine and the cache hold.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .models import Record
from .public import KINDS
from .taxonomy import Action, Blame, Category, Fact, Role, Source


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
    # Whose fault the category is here, where the line says otherwise than the category's
    # own blame (taxonomy.BLAME): the driver's own mismatch is the machine's software_incompat.
    blame: Optional[Blame] = None
    role: Role
    source: list[Source] = Field(min_length=1)  # sources a line must come from to count
    pattern: str
    ignore_case: bool = False
    explain: str                             # template over captures, {node} {rank} {gpu}
    # The captures the template shows, each with its kind (engine/public.py): summaries are
    # public, so every other capture (a message, a value, a path) stays out of them.
    public: dict[str, Literal[KINDS]] = Field(default_factory=dict)
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
    # How far one line of it, from a source the rule trusts, goes alone: `proves` names the
    # cause; `suggests` only points at it, and the cause stays a candidate (ambiguous with the
    # alternatives, or unattributed naming it as possible) until a second, independent line
    # (a proving root or a confirmation in the same incident) backs it.
    proves: Literal["proves", "suggests"] = "proves"
    # Families (gpu, nvlink, network, storage, workload) whose trusted incident on the same node
    # explains this line: a CUDA error on a node whose GPU fell off the bus is that GPU's fault.
    explained_by: list[str] = Field(default_factory=list)
    # Name of the capture a message catalog (engine/catalogs/*.tsv) is matched against; the
    # whole message when the rule has no such capture.
    catalog_key: str = "msg"
    recasts: Optional[Recast] = None
    # What a later stage reads its hits as (taxonomy.Fact: a GPU's identity, a failed probe,
    # a rank's progress counters, ...), so no stage asks for a rule by its id.
    fact: Optional[Fact] = None
    # Name of a capture that must be the same on every node of a job (a library or driver
    # version): where it differs, the odd node's line becomes a root of the rule's category.
    same_across_nodes: Optional[str] = None
    references: list[str] = Field(default_factory=list)
    examples: Examples

    @field_validator("source", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _blame_needs_category(self):
        if self.blame is not None and self.category is None:
            raise ValueError("blame says whose fault the rule's category is: it needs a category")
        return self


def record(v):
    """A validated model as a Record, recursively."""
    if isinstance(v, BaseModel):
        return Record({name: record(getattr(v, name)) for name in type(v).model_fields})
    if isinstance(v, list):
        return [record(x) for x in v]
    return v

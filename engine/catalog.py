"""Message catalogs: what each message an emitter prints means, as data beside the rules.

A catalog is a TSV file (`engine/catalogs/<emitter>.tsv`, or `*.tsv` in a site rules folder).
Each row refines the hits of one rule: the rule finds the family of lines (`NCCL WARN ...`,
`CUDA error: ...`, `[Errno N] ...`), the first row whose `match` pattern is found in the rule's
`msg` capture (or in the whole message when the rule captures no `msg`) says what that one
message is. A hit that no row matches keeps the rule's own role and category.

Columns (tab-separated, first line the header, `#` lines are comments):

    rule          id of the rule whose hits the row refines
    match         RE2 pattern searched in the message (linear time, prefilter-free)
    role          root | confirmation | symptom | teardown | context
    category      a contract category, or - for none
    action        an Action value, or - for the rule's own
    flags         comma list: weak (program-level or "maybe" evidence), last_resort (a root
                  only when nothing else in the job is), suggests (one line of it points at
                  the cause but does not prove it: the cause stays a candidate until a
                  second line backs it; without it the row proves), blame=<machine|workload|
                  site_environment|scheduler> (whose fault the row's category is here, where the
                  message says otherwise than the category's own blame), or -
    explained_by  comma list of families (gpu, nvlink, network, storage, workload) whose
                  trusted incident on the same node explains this message, or -
    emitter       repository and file that print the message (owner/repo path)
    version       the tag or version of that file the row was read from
    example       one line as the emitter prints it, matched by the rule and by this row
    note          why this role and category

`tools/catalog-source` prints where a row came from (and, with a local clone of the emitter,
the lines of the source that print it).
"""
from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .matcher import BytesPattern, PatternError, check_linear, closed, _parse
from .taxonomy import FAMILY, Action, Blame, Category, Role

import re2

BUILTIN_DIR = Path(__file__).parent / "catalogs"
COLUMNS = ("rule", "match", "role", "category", "action", "flags", "explained_by", "emitter",
           "version", "example", "note")
FLAGS = {"weak", "last_resort", "suggests"}
FAMILIES = sorted(set(FAMILY.values()))


class CatalogError(ValueError):
    """A catalog row is invalid; the message names the file, line and problem."""


@dataclass(frozen=True)
class Row:
    rule: str
    match: str
    rx: BytesPattern
    role: Role
    teardown: bool
    category: Optional[Category]
    action: Optional[Action]
    weak: bool
    last_resort: bool
    suggests: bool          # one line of it points at the cause; it needs a second to prove it
    explained_by: tuple[str, ...]
    blame: Optional[Blame]
    emitter: str
    version: str
    example: str
    note: str
    where: str               # "<file>:<line>" for provenance
    closed: bool = False     # the pattern matches only its own words, digits and spaces

    def search(self, text: str):
        return self.rx.search(text)

    def recognise(self, text: str) -> Optional[str]:
        """What the row's pattern matched in the text; for a closed row, only its own words
        (engine/public.py shows them in a summary)."""
        m = self.rx.search(text)
        return m.group(0) if m else None


def _opt(v: str) -> Optional[str]:
    v = v.strip()
    return None if v in ("", "-") else v


def _row(fields: dict, where: str) -> Row:
    missing = [c for c in COLUMNS if c not in fields or fields[c] is None]
    if missing:
        raise CatalogError(f"{where}: missing column(s) {', '.join(missing)}")
    role_s = fields["role"].strip()
    teardown = role_s == "teardown"
    try:
        role = Role.symptom if teardown else Role(role_s)
    except ValueError:
        raise CatalogError(f"{where}: role {role_s!r} is not one of root, confirmation, "
                           "symptom, teardown, context") from None
    try:
        cat = _opt(fields["category"])
        category = Category(cat) if cat else None
        act = _opt(fields["action"])
        action = Action(act) if act else None
    except ValueError as e:
        raise CatalogError(f"{where}: {e}") from None
    flags = {f.strip() for f in (_opt(fields["flags"]) or "").split(",") if f.strip()}
    blames = {f for f in flags if f.startswith("blame=")}
    if flags - FLAGS - blames:
        raise CatalogError(f"{where}: unknown flag(s) {sorted(flags - FLAGS - blames)} (known: "
                           "weak, last_resort, suggests, blame=...)")
    if len(blames) > 1 or blames and category is None:
        raise CatalogError(f"{where}: one blame= flag, on a row with a category")
    try:
        blame = Blame(blames.pop().partition("=")[2]) if blames else None
    except ValueError:
        raise CatalogError(f"{where}: blame must be one of "
                           f"{', '.join(b.value for b in Blame)}") from None
    fams = tuple(f.strip() for f in (_opt(fields["explained_by"]) or "").split(",")
                 if f.strip())
    if set(fams) - set(FAMILIES):
        raise CatalogError(f"{where}: explained_by names unknown families "
                           f"{sorted(set(fams) - set(FAMILIES))} (known: {', '.join(FAMILIES)})")
    if role == Role.root and category is None:
        raise CatalogError(f"{where}: a root row needs a category")
    pattern = fields["match"]
    try:
        parsed = _parse(pattern, False)
        check_linear(pattern, False, parsed)
    except PatternError as e:
        raise CatalogError(f"{where}: match {e}") from None
    opts = re2.Options()
    opts.log_errors = False
    try:
        rx = BytesPattern(re2.compile(pattern.encode("utf-8"), options=opts))
    except re2.error as e:
        raise CatalogError(f"{where}: match: RE2 cannot compile it: {e}") from None
    for col in ("rule", "emitter", "version", "example"):
        if not fields[col].strip():
            raise CatalogError(f"{where}: {col} is empty")
    return Row(rule=fields["rule"].strip(), match=pattern, rx=rx, role=role, teardown=teardown,
               category=category, action=action, weak="weak" in flags,
               last_resort="last_resort" in flags, suggests="suggests" in flags, explained_by=fams, blame=blame,
               emitter=fields["emitter"].strip(), version=fields["version"].strip(),
               example=fields["example"], note=fields["note"].strip(), where=where,
               closed=closed(pattern))


def read_catalog(path: Path, label: str, raw: Optional[bytes] = None) -> list[Row]:
    try:
        text = path.read_text(encoding="utf-8") if raw is None else raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"{label}: cannot read: {e}") from None
    body = [(i, ln) for i, ln in enumerate(text.splitlines(), 1)
            if ln.strip() and not ln.startswith("#")]
    if not body:
        return []
    header = body[0][1].split("\t")
    if tuple(header) != COLUMNS:
        raise CatalogError(f"{label}:{body[0][0]}: header must be: {chr(9).join(COLUMNS)}")
    rows = []
    for lineno, ln in body[1:]:
        vals = next(csv.reader(io.StringIO(ln), delimiter="\t", quoting=csv.QUOTE_NONE))
        if len(vals) != len(COLUMNS):
            raise CatalogError(f"{label}:{lineno}: {len(vals)} columns, expected "
                               f"{len(COLUMNS)}")
        rows.append(_row(dict(zip(COLUMNS, vals)), f"{label}:{lineno}"))
    return rows


def catalog_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tsv") if p.is_file())


def load_catalogs(roots: Iterable[tuple[Path, str]], read=None,
                  problems: Optional[list] = None) -> tuple[dict[str, list[Row]], str]:
    """Rows per rule id and a digest of what was read. Within a folder rows keep file-name then
    row order; a later folder's rows (a site's) come before the earlier ones, so they win.
    `read(path) -> bytes` reads a file (the loader's size-capped read). With `problems`, an
    invalid file outside the built-in catalogs is skipped and noted there; without, or in the
    built-in catalogs, it is a CatalogError."""
    read = read or (lambda path: path.read_bytes())
    by_rule: dict[str, list[Row]] = {}
    digest = hashlib.sha256()
    for root, prefix in roots:
        if not root.is_dir():
            continue
        mine: dict[str, list[Row]] = {}
        for path in catalog_files(root):
            label = prefix + path.relative_to(root).as_posix()
            try:
                try:
                    raw = read(path)
                except (OSError, ValueError) as e:
                    raise CatalogError(f"{label}: cannot read: {e}") from None
                rows = read_catalog(path, label, raw)
            except CatalogError as e:
                if problems is None or root == BUILTIN_DIR:
                    raise
                problems.append(f"{e} (file skipped)")
                continue
            for row in rows:
                mine.setdefault(row.rule, []).append(row)
            digest.update(label.encode() + b"\0" + raw + b"\0")
        for rule, rows in mine.items():
            by_rule[rule] = rows + by_rule.get(rule, [])
    return by_rule, digest.hexdigest()


def lookup(rows: list[Row], text: str) -> Optional[Row]:
    for row in rows:
        if row.search(text):
            return row
    return None

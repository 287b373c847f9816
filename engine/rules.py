"""Loading rule files: one YAML per rule, validated strictly, compiled once.

A rule's id is `<domain>.<mechanism>` and its file is `<domain>/<mechanism>.yaml`. Site rules
(`rules_dirs` in the config, `/etc/sattrib/rules.d` by default) load after the built-in ones; a
site rule with the id of a built-in rule replaces it.

Built-in rules are strict: a broken one is a bug and stops the load. A site's broken rule file
or catalog, loaded with `lenient_site`, is skipped and named in `RuleSet.problems`, which every
diagnosis made with that rule set carries in its notes: one bad file must not stop every
diagnosis. Files are size-capped, checked on the open file before anything is read.
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from . import decode, kmsg, public, rule_cache
from .catalog import (BUILTIN_DIR as CATALOG_DIR, CatalogError, Row, catalog_files, load_catalogs,
                      lookup)
from .lineparse import SRUN, clean, split_prefix
from .matcher import PatternError, Prefilter, compile_rule_pattern, digit_blind
from .taxonomy import FAMILY, Source

BUILTIN_DIR = Path(__file__).parent / "rules"

if TYPE_CHECKING:
    from .models import Record as Rule


MAX_RULE_BYTES = 1 << 20          # one rule's YAML
MAX_CATALOG_BYTES = 4 << 20       # one message catalog (the largest built-in is ~0.1 MiB)


class RuleError(ValueError):
    """A rule file is invalid; the message names the file and the problem."""


def read_capped(path: Path, cap: int) -> bytes:
    """A regular file's bytes, refused (ValueError) when fstat says it is bigger than `cap`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > cap:
            raise ValueError(f"{st.st_size} bytes, over the cap of {cap >> 20} MiB per file")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise ValueError(f"grew past the cap of {cap >> 20} MiB while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass
class CompiledRule:
    rule: Rule
    rx: object           # re2 pattern
    literals: list[str]
    caseless: bool
    path: str
    rows: tuple = ()     # message-catalog rows that refine this rule's hits (catalog.Row)
    digit_blind: bool = False   # matches alike on lines that differ only in digits (matcher)

    def search(self, message, kernel: bool = False):
        """RE2 search on a line (str or its UTF-8 bytes); None or a match with str groups.
        On a kernel record (`kernel`) only a match that begins where the record's own words
        do (engine/kmsg.py): text the kernel quotes from users never starts one."""
        if not kernel:
            return self.rx.search(message)
        data = message if isinstance(message, bytes) else message.encode("utf-8", "replace")
        for pos in kmsg.starts(data):
            m = self.rx.match(data, pos)
            if m:
                return m
        return None


class RuleSet:
    """All loaded rules, their prefilter and a version hash of exactly what was loaded."""

    def __init__(self, compiled: list[CompiledRule], version: str,
                 catalogs: Optional[dict[str, list[Row]]] = None,
                 problems: Optional[list[str]] = None):
        catalogs = catalogs or {}
        self.problems = list(problems or [])    # site files skipped, one line each
        for c in compiled:
            c.rows = tuple(catalogs.get(c.rule.id, ()))
        self.catalogs = catalogs
        self.rules = sorted(compiled, key=lambda c: c.rule.id)
        self.by_id = {c.rule.id: c for c in self.rules}
        self.version = version
        lits: dict[tuple[str, bool], list[str]] = {}
        for c in self.rules:
            for lit in c.literals:
                lits.setdefault((lit, c.caseless), []).append(c.rule.id)
        self.literal_keys = sorted(lits)
        self.literal_rules = [tuple(lits[k]) for k in self.literal_keys]
        self._prefilter: Optional[Prefilter] = None

    @property
    def prefilter(self) -> Prefilter:
        if self._prefilter is None:
            self._prefilter = Prefilter(self.literal_keys)
        return self._prefilter

    def __len__(self):
        return len(self.rules)


def _load_one(path: Path, root: Path, raw: Optional[bytes] = None) -> CompiledRule:
    import yaml  # noqa: PLC0415  (only when the rule cache misses: yaml and pydantic's
    from pydantic import ValidationError  # noqa: PLC0415  validation cost a start time)
    from .rule_spec import Rule, record  # noqa: PLC0415
    rel = path.relative_to(root).as_posix()
    try:
        raw = read_capped(path, MAX_RULE_BYTES) if raw is None else raw
    except (OSError, ValueError) as e:
        raise RuleError(f"{rel}: cannot read: {e}") from None
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml when PyYAML has it
        data = yaml.load(raw.decode("utf-8"), Loader=loader)
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise RuleError(f"{rel}: cannot read YAML: {e}") from None
    if not isinstance(data, dict):
        raise RuleError(f"{rel}: expected a mapping of rule fields")
    try:
        rule = record(Rule.model_validate(data))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(rule)"
        raise RuleError(f"{rel}: {where}: {first['msg']}") from None
    domain, mech = rule.id.split(".", 1)
    want = f"{domain}/{mech}.yaml"
    if rel != want:
        raise RuleError(f"{rel}: rule id {rule.id!r} must live in {want}")
    if rule.decode is not None and rule.decode not in decode.DECODERS:
        raise RuleError(f"{rel}: decode: unknown decoder {rule.decode!r} "
                        f"(known: {', '.join(sorted(decode.DECODERS))})")
    try:
        rx, lits, caseless = compile_rule_pattern(rule.pattern, rule.ignore_case)
    except PatternError as e:
        raise RuleError(f"{rel}: pattern {e}") from None
    problem = public.check(rule)
    if problem:
        raise RuleError(f"{rel}: {problem}")
    bad = sorted(set(rule.explained_by) - set(FAMILY.values()))
    if bad:
        raise RuleError(f"{rel}: explained_by: unknown family {', '.join(map(repr, bad))} "
                        f"(known: {', '.join(sorted(set(FAMILY.values())))})")
    return CompiledRule(rule, rx, lits, caseless, rel,
                        digit_blind=digit_blind(rule.pattern, rule.ignore_case))


def unknown_recasts(rules, known: set) -> list[tuple[str, str]]:
    """(rule id, problem) for each `recasts.rules` id that names no loaded rule: a relation that
    would silently never hold."""
    return [(c.rule.id, f"{c.path}: recasts.rules: {rid!r} is not a loaded rule")
            for c in rules if c.rule.recasts for rid in c.rule.recasts.rules if rid not in known]


def rule_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def input_roots(extra_dirs: Iterable[Path], builtin: bool) -> list[Path]:
    """The folders a rule set loads from, in order: the built-in rules and catalogs, then
    each site folder."""
    return ([BUILTIN_DIR, CATALOG_DIR] if builtin else []) + [Path(d) for d in extra_dirs]


def input_files(root: Path) -> list[Path]:
    """The files of a folder that a rule set reads: rule files and catalogs."""
    return sorted(set(rule_files(root)) | set(catalog_files(root)))


def load_rules(extra_dirs: Iterable[Path] = (), builtin: bool = True,
                lenient_site: bool = False, cache: bool = True) -> RuleSet:
    """Built-in rules, then each site folder's. `lenient_site`: a site file that does not load
    is skipped and named in the rule set's `problems` instead of stopping the load. `cache`:
    the compiled set from disk when its inputs are unchanged (a set with problems is never
    cached, so a strict load still raises and a lenient one still reports them)."""
    extra_dirs = [Path(d) for d in extra_dirs]
    if cache:
        return rule_cache.cached(
            lambda: load_rules(extra_dirs, builtin, lenient_site=lenient_site, cache=False),
            input_roots(extra_dirs, builtin), input_files, RuleSet)
    compiled: dict[str, CompiledRule] = {}
    builtin_ids: set = set()
    problems: list[str] = []
    digest = hashlib.sha256()
    roots = ([BUILTIN_DIR] if builtin else []) + extra_dirs
    for root in roots:
        if not root.is_dir():
            continue
        for path in rule_files(root):
            try:
                raw = read_capped(path, MAX_RULE_BYTES)
                c = _load_one(path, root, raw)
            except (OSError, ValueError) as e:
                err = e if isinstance(e, RuleError) else RuleError(
                    f"{path.relative_to(root).as_posix()}: cannot read: {e}")
                if not lenient_site or root == BUILTIN_DIR:
                    raise err from None
                problems.append(f"{root}/{err} (rule skipped)")
                continue
            compiled[c.rule.id] = c
            if root == BUILTIN_DIR:
                builtin_ids.add(c.rule.id)
            digest.update(c.path.encode() + b"\0" + raw + b"\0")
    try:
        digest.update(decode.catalog_digest().encode())
    except ValueError as e:          # a row of the Xid policy that does not hold
        raise RuleError(str(e)) from None
    try:
        catalogs, cat_digest = load_catalogs(
            ([(CATALOG_DIR, "catalogs/")] if builtin else []) +
            [(d, f"{d}/") for d in extra_dirs],
            read=lambda p: read_capped(p, MAX_CATALOG_BYTES),
            problems=problems if lenient_site else None)
    except CatalogError as e:
        raise RuleError(str(e)) from None
    for rule in sorted(r for r in catalogs if r not in compiled):
        rows = catalogs[rule]
        if not lenient_site or any(row.where.startswith("catalogs/") for row in rows):
            raise RuleError(f"{rows[0].where}: rule {rule!r} is not a loaded rule")
        problems.append(f"{rows[0].where}: rule {rule!r} is not a loaded rule "
                        f"({len(rows)} catalog rows skipped)")
        del catalogs[rule]
    digest.update(cat_digest.encode())
    for rid, problem in unknown_recasts(compiled.values(), set(compiled)):
        if not lenient_site or rid in builtin_ids:
            raise RuleError(problem)
        problems.append(f"{problem} (rule skipped)")
        del compiled[rid]
    return RuleSet(list(compiled.values()), "sha256:" + digest.hexdigest()[:16], catalogs,
                   problems)


# A kernel record that quotes a user's path: a kernel rule reads none of what it quotes.
QUOTED = 'audit: type=1400 audit(0.0:1): exe="{}"'


def read_as_kernel(rule: Rule, p) -> bool:
    """Whether an example line (split_prefix's `p`) is read as a kernel record: the rule reads
    kernel records and the line is one by its form, or the rule reads nothing else."""
    src = rule.source
    return Source.kernel in src and (p.kernel_form or p.ident == "kernel" or
                                     src == [Source.kernel])


def check_catalog_examples(rs: RuleSet, prefix: str = "") -> list[str]:
    """Every catalog row's example (of the rows whose file starts with prefix) is a hit of its
    rule and is classified by that row."""
    errors = []
    for c in rs.rules:
        for row in c.rows:
            if not row.where.startswith(prefix):
                continue
            p = split_prefix(clean(row.example), tags=SRUN)
            msg = p.message
            m = c.search(msg, read_as_kernel(c.rule, p))
            if not m:
                errors.append(f"{row.where}: rule {c.rule.id} does not match the example "
                              f"{row.example!r}")
                continue
            key = m.group(c.rule.catalog_key) or msg
            got = lookup(list(c.rows), key)
            if got is not row:
                errors.append(f"{row.where}: example {row.example!r} is classified by "
                              f"{got.where if got else 'no row'}, not by this row")
    return errors


def check_examples(c: CompiledRule) -> list[str]:
    """Run a rule's own examples; returns the failures as readable lines."""
    errors = []
    for ex in c.rule.examples.match:
        p = split_prefix(clean(ex.line), tags=SRUN)
        msg = p.message
        m = c.search(msg, read_as_kernel(c.rule, p))
        if not m:
            errors.append(f"{c.path}: does not match its example: {ex.line!r}")
            continue
        got = {k: v for k, v in m.groupdict().items() if v is not None}
        for k, v in ex.captures.items():
            if got.get(k) != v:
                errors.append(f"{c.path}: capture {k!r} is {got.get(k)!r}, example says {v!r}")
        lines = [ex.line]
        if not any((lit.lower() in ex.line.lower()) if c.caseless else (lit in ex.line)
                   for lit in c.literals):
            errors.append(f"{c.path}: prefilter literals {c.literals} miss {lines[0]!r}")
        if Source.kernel in c.rule.source and c.search(QUOTED.format(msg), True):
            errors.append(f"{c.path}: matches its example quoted in a kernel record "
                          f"({QUOTED.format('...')!r}): begin the pattern with the emitter's "
                          "own words")
    for ex in c.rule.examples.no_match:
        p = split_prefix(clean(ex.line), tags=SRUN)
        if c.search(p.message, read_as_kernel(c.rule, p)):
            errors.append(f"{c.path}: matches its no_match example: {ex.line!r}")
    return errors


def check_dir(root: Path) -> tuple[int, list[str]]:
    """Validate every rule under root and run its examples. Returns (rules checked, errors)."""
    errors: list[str] = []
    n = 0
    seen: dict[str, str] = {}
    loaded: list[CompiledRule] = []
    for path in rule_files(root):
        n += 1
        try:
            c = _load_one(path, root)
        except RuleError as e:
            errors.append(str(e))
            continue
        if c.rule.id in seen:
            errors.append(f"{c.path}: duplicate id {c.rule.id} (also {seen[c.rule.id]})")
        seen[c.rule.id] = c.path
        loaded.append(c)
        errors.extend(check_examples(c))
    # A rule's id is its path: the built-in ids without loading them.
    builtin = {p.relative_to(BUILTIN_DIR).with_suffix("").as_posix().replace("/", ".")
               for p in rule_files(BUILTIN_DIR)}
    errors.extend(p for _, p in unknown_recasts(loaded, set(seen) | builtin))
    return n, errors

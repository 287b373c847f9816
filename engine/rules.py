"""Loading rule files: one YAML per rule, validated strictly, compiled once.

A rule's id is `<domain>.<mechanism>` and its file is `<domain>/<mechanism>.yaml`. Site rules
(`rules_dirs` in the config, `/etc/sattrib/rules.d` by default) load after the built-in ones; a
site rule with the id of a built-in rule replaces it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from . import decode
from .catalog import BUILTIN_DIR as CATALOG_DIR, CatalogError, Row, load_catalogs, lookup
from .lineparse import clean, split_prefix
from .matcher import PatternError, Prefilter, compile_rule_pattern
from .models import Rule

BUILTIN_DIR = Path(__file__).parent / "rules"


class RuleError(ValueError):
    """A rule file is invalid; the message names the file and the problem."""


@dataclass
class CompiledRule:
    rule: Rule
    rx: object           # re2 pattern
    literals: list[str]
    caseless: bool
    path: str
    rows: tuple = ()     # message-catalog rows that refine this rule's hits (catalog.Row)

    def search(self, message):
        """RE2 search on a line (str or its UTF-8 bytes); None or a match with str groups."""
        return self.rx.search(message)


class RuleSet:
    """All loaded rules, their prefilter and a version hash of exactly what was loaded."""

    def __init__(self, compiled: list[CompiledRule], version: str,
                 catalogs: Optional[dict[str, list[Row]]] = None):
        catalogs = catalogs or {}
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


def _load_one(path: Path, root: Path) -> CompiledRule:
    import yaml  # noqa: PLC0415  (only when the rule cache misses: yaml and pydantic's
    from pydantic import ValidationError  # noqa: PLC0415  validation cost a start time)
    rel = path.relative_to(root).as_posix()
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml when PyYAML has it
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RuleError(f"{rel}: cannot read YAML: {e}") from None
    if not isinstance(data, dict):
        raise RuleError(f"{rel}: expected a mapping of rule fields")
    try:
        rule = Rule.model_validate(data)
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
    return CompiledRule(rule, rx, lits, caseless, rel)


def rule_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def load_rules(extra_dirs: Iterable[Path] = (), builtin: bool = True,
               cache: bool = True) -> RuleSet:
    if cache:                        # the compiled set from disk when its inputs are unchanged
        from .rule_cache import cached
        return cached(lambda d, b: load_rules(d, b, cache=False), extra_dirs, builtin)
    compiled: dict[str, CompiledRule] = {}
    digest = hashlib.sha256()
    roots = ([BUILTIN_DIR] if builtin else []) + [Path(d) for d in extra_dirs]
    for root in roots:
        if not root.is_dir():
            continue
        for path in rule_files(root):
            c = _load_one(path, root)
            compiled[c.rule.id] = c
            digest.update(c.path.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(decode.catalog_digest().encode())
    try:
        catalogs, cat_digest = load_catalogs(
            ([(CATALOG_DIR, "catalogs/")] if builtin else []) +
            [(Path(d), f"{d}/") for d in extra_dirs])
    except CatalogError as e:
        raise RuleError(str(e)) from None
    unknown = sorted(r for r in catalogs if r not in compiled)
    if unknown:
        row = catalogs[unknown[0]][0]
        raise RuleError(f"{row.where}: rule {row.rule!r} is not a loaded rule")
    digest.update(cat_digest.encode())
    return RuleSet(list(compiled.values()), "sha256:" + digest.hexdigest()[:16], catalogs)


def check_catalog_examples(rs: RuleSet, prefix: str = "") -> list[str]:
    """Every catalog row's example (of the rows whose file starts with prefix) is a hit of its
    rule and is classified by that row."""
    errors = []
    for c in rs.rules:
        for row in c.rows:
            if not row.where.startswith(prefix):
                continue
            msg = split_prefix(clean(row.example), srun=True).message
            m = c.search(msg)
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
        msg = split_prefix(clean(ex.line), srun=True).message
        m = c.search(msg)
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
    for ex in c.rule.examples.no_match:
        msg = split_prefix(clean(ex.line), srun=True).message
        if c.search(msg):
            errors.append(f"{c.path}: matches its no_match example: {ex.line!r}")
    return errors


def check_dir(root: Path) -> tuple[int, list[str]]:
    """Validate every rule under root and run its examples. Returns (rules checked, errors)."""
    errors: list[str] = []
    n = 0
    seen: dict[str, str] = {}
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
        errors.extend(check_examples(c))
    return n, errors

"""Compiling rule patterns: linear-time check, required literals, and the literal prefilter.

Every rule pattern runs on RE2 (google-re2), which matches in time linear in the line length.
Constructs RE2 cannot run that way (back-references, look-around, atomic groups, possessive
repeats, conditionals) are rejected when the rule loads, with a message naming the construct.

Scanning gigabytes of rank output line by line in Python would be slow, so each rule also yields
the set of literal strings one of which must appear in any line it matches (derived from the
pattern, like RE2's and Hyperscan's own prefilters). One multi-literal automaton (Hyperscan when
installed, otherwise a Python alternation) finds the few lines worth running the rules on.
"""
from __future__ import annotations

import re
import re._constants as C  # noqa: N812  (the stdlib's own parser: exact Python regex syntax)
import re._parser as P  # noqa: N812

import re2

MIN_LITERAL = 3

_REJECT = {
    C.GROUPREF: "a back-reference",
    C.GROUPREF_EXISTS: "a conditional group",
    C.ASSERT: "a look-ahead/look-behind",
    C.ASSERT_NOT: "a negative look-ahead/look-behind",
    C.ATOMIC_GROUP: "an atomic group",
    C.POSSESSIVE_REPEAT: "a possessive repeat",
}


class PatternError(ValueError):
    """The pattern cannot be used: bad syntax, not linear-time, or no usable literal."""


def _walk(items, out):
    for op, av in items:
        if op in _REJECT:
            out.add(_REJECT[op])
            continue
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            _walk(av[2], out)
        elif op == C.SUBPATTERN:
            _walk(av[3], out)
        elif op == C.BRANCH:
            for b in av[1]:
                _walk(b, out)


def _parse(pattern: str, ignore_case: bool):
    try:
        return P.parse(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise PatternError(f"invalid regular expression: {e}") from None


def check_linear(pattern: str, ignore_case: bool = False, parsed=None) -> None:
    parsed = parsed if parsed is not None else _parse(pattern, ignore_case)
    bad: set[str] = set()
    _walk(parsed.data, bad)
    if bad:
        raise PatternError(
            f"uses {', '.join(sorted(bad))}, which cannot be matched in linear time; "
            "rewrite it without (RE2 syntax)")


_CLOSED_CATEGORIES = {C.CATEGORY_DIGIT, C.CATEGORY_SPACE}


def _closed_class(members) -> bool:
    return all(op == C.LITERAL or (op == C.CATEGORY and av in _CLOSED_CATEGORIES)
               or (op == C.RANGE and ord("0") <= av[0] and av[1] <= ord("9"))
               for op, av in members)


def _every_atom(items, atom_ok) -> bool:
    """Does `atom_ok(op, av)` hold for every atom of a parsed pattern (through its repeats,
    groups and alternatives)?"""
    for op, av in items:
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            ok = _every_atom(av[2], atom_ok)
        elif op == C.SUBPATTERN:
            ok = _every_atom(av[3], atom_ok)
        elif op == C.BRANCH:
            ok = all(_every_atom(b, atom_ok) for b in av[1])
        else:
            ok = atom_ok(op, av)
        if not ok:
            return False
    return True


def _closed_atom(op, av) -> bool:
    return op in (C.LITERAL, C.AT) or (op == C.IN and _closed_class(av))


def _closed(items) -> bool:
    return _every_atom(items, _closed_atom)


def _group(items, gid: int):
    for op, av in items:
        if op == C.SUBPATTERN and av[0] == gid:
            return av[3]
        subs = ([av[3]] if op == C.SUBPATTERN else [av[2]] if op in (C.MAX_REPEAT, C.MIN_REPEAT)
                else av[1] if op == C.BRANCH else [])
        for sub in subs:
            found = _group(sub, gid)
            if found is not None:
                return found
    return None


def closed(pattern: str, group: str | None = None) -> bool:
    """Can the pattern (or its named group) match only the words written in it, digits and
    white space? `No space left on device`, `TIME LIMIT|PREEMPTION`, `\\d+ bytes` can;
    `.+`, `\\S+`, `[A-Z_]+`, `[^']*` can match anything a user writes. Raises PatternError for
    a group the pattern does not have."""
    parsed = _parse(pattern, False)
    items = parsed.data
    if group is not None:
        gid = parsed.state.groupdict.get(group)
        items = _group(parsed.data, gid) if gid is not None else None
        if items is None:
            raise PatternError(f"has no group named {group!r}")
    return _closed(items)


_DIGITS = frozenset(range(ord("0"), ord("9") + 1))
# What a class category holds of the ten digits: all of them, or none.
_CATEGORY_DIGITS = {C.CATEGORY_DIGIT: True, C.CATEGORY_NOT_DIGIT: False,
                    C.CATEGORY_SPACE: False, C.CATEGORY_NOT_SPACE: True,
                    C.CATEGORY_WORD: True, C.CATEGORY_NOT_WORD: False,
                    C.CATEGORY_LINEBREAK: False, C.CATEGORY_NOT_LINEBREAK: True}


def _class_digits(members) -> bool | None:
    """Which digits a character class takes: True all ten, False none, None some of them."""
    held: set[int] = set()
    negate = False
    for op, av in members:
        if op == C.NEGATE:
            negate = True
        elif op == C.LITERAL:
            held |= {av} & _DIGITS
        elif op == C.RANGE:
            held |= set(range(av[0], av[1] + 1)) & _DIGITS
        elif op == C.CATEGORY and av in _CATEGORY_DIGITS:
            held |= _DIGITS if _CATEGORY_DIGITS[av] else set()
        else:
            return None
    if held and held != _DIGITS:
        return None
    return bool(held) != negate


def _digit_blind_atom(op, av) -> bool:
    if op in (C.LITERAL, C.NOT_LITERAL):
        return av not in _DIGITS
    if op == C.IN:
        return _class_digits(av) is not None
    return op in (C.ANY, C.AT)


def digit_blind(pattern: str, ignore_case: bool = False) -> bool:
    """Does the pattern treat every digit alike (`\\d+`, `[0-9a-f]`, `.`, `\\S`, no `79` or
    `[1-3]`)? Then whether it matches a line, and where its groups are, is the same for every
    line that differs from it only in which digits it holds: ranks, times, addresses, counts.
    (RE2's `\\d`, `\\w` and `\\b` know only the ASCII digits, the only ones that vary.)"""
    return _every_atom(_parse(pattern, ignore_case).data, _digit_blind_atom)


class SpanMatch:
    """A rule's match on a line, from where its groups were on another line of the same shape
    (see digit_blind): answers groupdict() as Match does."""
    __slots__ = ("_data", "_spans")

    def __init__(self, data: bytes, spans: tuple):
        self._data = data
        self._spans = spans

    def groupdict(self) -> dict:
        data = self._data
        return {k: None if s < 0 else data[s:e].decode("utf-8", "replace")
                for k, (s, e) in self._spans}


def spans(m: Match) -> tuple:
    """(group name, (start, end)) of each named group of a match; (-1, -1) when not taken."""
    raw = m._m
    return tuple(((k.decode() if isinstance(k, bytes) else k), raw.span(i))
                 for k, i in raw.re.groupindex.items())


def search_all(by_id: dict, msg: bytes, lits, kernel: bool) -> dict:
    """{rule id: match} of the candidate rules that match the message, each searched."""
    return {rid: m for rid in lits if (c := by_id.get(rid)) is not None
            and (m := c.search(msg, kernel))}


class ShapeSearch:
    """The rules a line's literals point at, run once per message shape.

    Thousands of ranks print the same NCCL or PyTorch message with their own numbers in it. A
    digit-blind rule (see `digit_blind`) gives every such line the answer it gave the first:
    the shape (the message with each digit read as 0, same length) is searched once and the
    groups of the later lines are cut out where the first one's were. Other rules, and kernel
    records (their starts depend on the digits of a task's pid), are searched on every line.
    Bounded: the shapes are forgotten every `CAP` of them."""
    CAP = 4096
    _SHAPE = bytes.maketrans(b"123456789", b"000000000")

    def __init__(self, by_id: dict):
        self.by_id = by_id
        self.memo: dict = {}

    def __call__(self, msg: bytes, lits, kernel: bool) -> dict:
        """{rule id: match} of the candidate rules that match the message."""
        by_id = self.by_id
        if kernel:
            return search_all(by_id, msg, lits, True)
        key = (msg.translate(self._SHAPE), frozenset(lits))
        known = self.memo.get(key)
        if known is None:
            return self._first(key, msg, lits)
        hit = {rid: SpanMatch(msg, sp) for rid, sp in known[0]}
        for rid in known[1]:
            m = by_id[rid].search(msg)
            if m:
                hit[rid] = m
        return hit

    def _first(self, key, msg: bytes, lits) -> dict:
        hit, blind, others = {}, [], []
        for rid in lits:
            c = self.by_id.get(rid)
            if c is None:
                continue
            m = c.search(msg)
            if m:
                hit[rid] = m
            if not c.digit_blind:
                others.append(rid)
            elif m:
                blind.append((rid, spans(m)))
        if len(self.memo) >= self.CAP:
            self.memo.clear()
        self.memo[key] = (tuple(blind), tuple(others))
        return hit


def group_names(pattern: str) -> set[str]:
    """The names of the pattern's named groups (its captures)."""
    return set(_parse(pattern, False).state.groupdict)


def _best(cands: list[set[str]]) -> set[str] | None:
    """Pick the literal set that filters best: longest shortest member, then fewest members."""
    good = [c for c in cands if c]
    if not good:
        return None
    return max(good, key=lambda s: (min(len(x) for x in s), -len(s), sorted(s)))


def _required(items, fold: bool) -> set[str] | None:
    """Set of literals one of which every match of `items` (a sequence) must contain."""
    cands: list[set[str]] = []
    run: list[str] = []

    def flush():
        if run:
            cands.append({"".join(run)})
            run.clear()

    for op, av in items:
        if op == C.LITERAL:
            ch = chr(av)
            run.append(ch.lower() if fold else ch)
            continue
        flush()
        if op == C.SUBPATTERN:
            sub = _required(av[3], fold)
            if sub:
                cands.append(sub)
        elif op == C.BRANCH:
            alts = [_required(b, fold) for b in av[1]]
            if all(alts):
                cands.append(set().union(*alts))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT) and av[0] >= 1:
            sub = _required(av[2], fold)
            if sub:
                cands.append(sub)
    flush()
    return _best(cands)


def _scoped_ignorecase(items) -> bool:
    """Does any group switch on (?i:...) inside the pattern?"""
    for op, av in items:
        if op == C.SUBPATTERN:
            if av[1] & re.IGNORECASE or _scoped_ignorecase(av[3]):
                return True
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT) and _scoped_ignorecase(av[2]):
            return True
        elif op == C.BRANCH and any(_scoped_ignorecase(b) for b in av[1]):
            return True
    return False


def caseless(pattern: str, ignore_case: bool = False, parsed=None) -> bool:
    """Whether the prefilter must match this pattern's literals without regard to case."""
    parsed = parsed if parsed is not None else _parse(pattern, ignore_case)
    return ignore_case or bool(parsed.state.flags & re.IGNORECASE) or \
        _scoped_ignorecase(parsed.data)


def required_literals(pattern: str, ignore_case: bool = False, parsed=None) -> list[str]:
    """Literals of which any match must contain one; raises if none is long enough to filter."""
    parsed = parsed if parsed is not None else _parse(pattern, ignore_case)
    fold = caseless(pattern, ignore_case, parsed)
    lits = _required(parsed.data, fold)
    if not lits or min(len(x) for x in lits) < MIN_LITERAL:
        raise PatternError(
            f"has no literal text of {MIN_LITERAL}+ characters that every match must contain; "
            "anchor it on a fixed word of the message so it can be prefiltered")
    return sorted(lits)


def compile_rule_pattern(pattern: str, ignore_case: bool = False):
    """Validate and compile for RE2. Returns (compiled, literals, caseless)."""
    parsed = _parse(pattern, ignore_case)
    check_linear(pattern, ignore_case, parsed)
    lits = required_literals(pattern, ignore_case, parsed)
    fold = caseless(pattern, ignore_case, parsed)
    opts = re2.Options()
    opts.case_sensitive = not (ignore_case or bool(parsed.state.flags & re.IGNORECASE))
    opts.log_errors = False
    try:
        # Compiled for bytes: the Python binding is several times faster on bytes than on str.
        rx = re2.compile(pattern.encode("utf-8"), options=opts)
    except re2.error as e:  # pragma: no cover - check_linear catches the known differences
        raise PatternError(f"RE2 cannot compile it: {e}") from None
    return BytesPattern(rx), lits, fold


class Match:
    """A match on UTF-8 bytes, answering in str like a `re` match."""
    __slots__ = ("_m",)

    def __init__(self, m):
        self._m = m

    def groupdict(self) -> dict:
        return {(k.decode() if isinstance(k, bytes) else k):
                (None if v is None else v.decode("utf-8", "replace"))
                for k, v in self._m.groupdict().items()}

    def group(self, name=0):
        if isinstance(name, str):
            return self.groupdict().get(name)
        v = self._m.group(name)
        return None if v is None else v.decode("utf-8", "replace")


def _re2_bytes(pattern: bytes, case_sensitive: bool):
    opts = re2.Options()
    opts.case_sensitive = case_sensitive
    opts.log_errors = False
    return re2.compile(pattern, options=opts)


class BytesPattern:
    """An RE2 pattern searched on the UTF-8 encoding of a str.

    It pickles as its source; an unpickled one compiles on its first search (most catalog rows
    are never searched in a given job, and compiling all of them costs more than the rest of a
    cached rule load)."""
    __slots__ = ("rx", "src")

    def __init__(self, rx, src=None):
        self.rx = rx
        self.src = src or (rx.pattern, rx.options.case_sensitive)

    def __reduce__(self):
        return (BytesPattern, (None, self.src))

    def search(self, text):
        rx = self.rx
        if rx is None:
            rx = self.rx = _re2_bytes(*self.src)
        m = rx.search(text if isinstance(text, bytes) else text.encode("utf-8", "replace"))
        return Match(m) if m else None

    def match(self, data: bytes, pos: int = 0):
        """The match that begins exactly at byte offset `pos` of `data`, or None."""
        rx = self.rx
        if rx is None:
            rx = self.rx = _re2_bytes(*self.src)
        m = rx.match(data, pos)
        return Match(m) if m else None


class Prefilter:
    """Finds every occurrence of any of a set of literals in a byte buffer.

    `scan(buf)` returns a sorted list of (end_offset, literal_index). Hyperscan is used when it
    imports (x86_64 wheels); the fallback (aarch64) is one RE2 alternation of every literal,
    matched caselessly (RE2 runs it as one automaton: Python's `re` tried the literals one by
    one at every byte, 0.4 MB/s), then each literal is looked up on the lines it found.
    """

    def __init__(self, literals: list[tuple[str, bool]]):
        self.literals = literals
        self.max_len = max((len(s.encode()) for s, _ in literals), default=1)
        self._hs = None
        try:
            import hyperscan  # noqa: PLC0415  (optional, platform dependent)
        except ImportError:  # pragma: no cover - exercised on non-x86 machines
            hyperscan = None
        if hyperscan is not None and literals:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            exprs = [re.escape(s).encode() for s, _ in literals]
            flags = [hyperscan.HS_FLAG_CASELESS if ci else 0 for _, ci in literals]
            db.compile(expressions=exprs, ids=list(range(len(literals))),
                       elements=len(literals), flags=flags)
            self._hs = db
        else:
            self._alt = b"|".join(re.escape(s.encode()) for s, _ in literals)
            self._rx = None                       # compiled on first use (RE2 does not pickle)
            self._folded = [(s.lower().encode() if ci else s.encode(), ci)
                            for s, ci in literals]

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_rx", None)
        if self._hs is not None:
            import hyperscan  # noqa: PLC0415
            state["_hs"] = hyperscan.dumpb(self._hs)     # a Database does not pickle
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._rx = None
        if self._hs is not None:
            import hyperscan  # noqa: PLC0415
            self._hs = hyperscan.loadb(self._hs, hyperscan.HS_MODE_BLOCK)
            self._hs.scratch = hyperscan.Scratch(self._hs)

    @property
    def engine(self) -> str:
        return "hyperscan" if self._hs is not None else "re2"

    def scan(self, buf) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        if not self.literals or not buf:
            return hits
        if self._hs is not None:
            def on_match(lit_id, _from, to, _flags, _ctx):
                hits.append((to, lit_id))
            self._hs.scan(bytes(buf) if isinstance(buf, memoryview) else buf,
                          match_event_handler=on_match)
        else:
            # Find lines holding any literal, then list every literal on each such line
            # (overlapping ones included), as Hyperscan would report them.
            if isinstance(buf, memoryview):
                buf = buf.tobytes()
            if self._rx is None:
                opts = re2.Options()
                opts.case_sensitive = False
                opts.log_errors = False
                opts.max_mem = 256 << 20          # room for the automaton of ~500 literals
                self._rx = re2.compile(self._alt, options=opts)
            seen = -1
            for m in self._rx.finditer(buf):
                if m.start() < seen:
                    continue
                ls = buf.rfind(b"\n", 0, m.start()) + 1
                le = buf.find(b"\n", m.end())
                le = len(buf) if le < 0 else le
                seen = le
                seg = bytes(buf[ls:le])
                low = seg.lower()
                for i, (lit, ci) in enumerate(self._folded):
                    hay = low if ci else seg
                    j = hay.find(lit)
                    while j >= 0:
                        hits.append((ls + j + len(lit), i))
                        j = hay.find(lit, j + 1)
        hits.sort()
        return hits

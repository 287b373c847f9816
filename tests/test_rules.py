"""Every rule file: schema, id matches path, unique ids, its own examples; the loader's errors."""
import re
from pathlib import Path

import pytest

from sattrib.engine.matcher import PatternError, check_linear, required_literals
from sattrib.engine.rules import BUILTIN_DIR, RuleError, check_examples, load_rules, rule_files
from sattrib.engine.rules import _load_one, check_dir

FILES = rule_files(BUILTIN_DIR)


def test_there_are_rules_in_every_domain():
    domains = {p.parent.name for p in FILES}
    assert {"gpu", "nvlink", "net", "nccl", "torch", "cuda", "host", "storage", "slurm"} <= domains
    assert len(FILES) >= 60


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_rule_file(path):
    c = _load_one(path, BUILTIN_DIR)
    assert c.rule.id == f"{path.parent.name}.{path.stem}"
    assert c.rule.examples.match, "every rule needs at least one match example"
    assert check_examples(c) == []


def test_ids_unique_and_version_stable():
    a, b = load_rules(), load_rules()
    assert len({c.rule.id for c in a.rules}) == len(a.rules) == len(FILES)
    assert a.version == b.version and a.version.startswith("sha256:")


def _write(tmp_path, rel, text):
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


GOOD = """id: site.thing
title: A thing
category: storage_io
role: root
source: kernel
pattern: 'thing (?P<n>\\d+) failed'
explain: 'thing {n}'
public: {n: number}
examples:
  match:
    - line: 'thing 3 failed'
      captures: {n: '3'}
  no_match:
    - line: 'thing 3 ok'
"""


def test_site_rule_loads_and_changes_version(tmp_path):
    _write(tmp_path, "site/thing.yaml", GOOD)
    rs = load_rules([tmp_path])
    assert "site.thing" in rs.by_id
    assert rs.version != load_rules().version


@pytest.mark.parametrize("change,needle", [
    (("pattern: 'thing (?P<n>\\d+) failed'", "pattern: 'thing (?P<n>\\d+ failed'"), "invalid regular expression"),
    (("pattern: 'thing (?P<n>\\d+) failed'", "pattern: '(a+)\\1 thing'"), "linear time"),
    (("pattern: 'thing (?P<n>\\d+) failed'", "pattern: '(?<=x)thing'"), "look-ahead/look-behind"),
    (("pattern: 'thing (?P<n>\\d+) failed'", "pattern: '\\d+ \\w+'"), "no literal text"),
    (("role: root", "role: culprit"), "role"),
    (("category: storage_io", "category: disk"), "category"),
    (("title: A thing", "title: A thing\ncolour: red"), "colour"),
    (("public: {n: number}", "public: {}"), "explain: n is the user's text"),
    (("public: {n: number}", "public: {n: words, m: name}"), "no capture 'm'"),
    (("public: {n: number}", "public: {n: prose}"), "public.n"),
    (("role: root", "role: root\nexplained_by: [gpus]"), "explained_by: unknown family 'gpus'"),
    (("role: root", "role: root\nrecasts: {rules: [python.exceptoin], why: a typo}"),
     "recasts.rules: 'python.exceptoin' is not a loaded rule"),
    (("role: root", "role: root\nproves: maybe"), "proves"),
])
def test_bad_rules_name_the_file(tmp_path, change, needle):
    _write(tmp_path, "site/thing.yaml", GOOD.replace(*change))
    with pytest.raises(RuleError) as e:
        load_rules([tmp_path])
    assert "site/thing.yaml" in str(e.value) and needle in str(e.value)


def test_id_must_match_path(tmp_path):
    _write(tmp_path, "site/other.yaml", GOOD)
    with pytest.raises(RuleError, match="must live in site/thing.yaml"):
        load_rules([tmp_path])


def test_failing_example_is_reported(tmp_path):
    from sattrib.engine.rules import check_dir
    _write(tmp_path, "site/thing.yaml", GOOD.replace("thing 3 ok", "thing 4 failed"))
    n, errors = check_dir(tmp_path)
    assert n == 1 and len(errors) == 1 and "no_match" in errors[0]


def test_literals_and_linear_check():
    assert required_literals(r"NET/IB\s?: Got completion from peer (\S+)") == [": Got completion from peer "]
    # A required alternation is a set of literals, one of which every match contains.
    assert sorted(required_literals(r"(?:alpha|beta)ish")) == ["alpha", "beta"]
    with pytest.raises(PatternError):
        check_linear(r"(?P<a>x)(?P=a)")
    check_linear(r"NVRM: Xid \((?P<pci>[0-9a-f:.]+)\)")


def test_the_site_rules_readme_examples_load_and_pass(tmp_path):
    """etc/rules.d/README.md shows a site rule and a site catalog row: both must work as shown."""
    import re
    from sattrib.engine.rules import check_catalog_examples
    from helpers import ROOT
    text = (ROOT / "etc" / "rules.d" / "README.md").read_text()
    yaml_block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    tsv_block = re.search(r"```text\n(rule\t.*?)```", text, re.S).group(1)
    rid = re.search(r"^id: (\w+)\.(\w+)$", yaml_block, re.M)
    (tmp_path / rid.group(1)).mkdir()
    (tmp_path / rid.group(1) / f"{rid.group(2)}.yaml").write_text(yaml_block)
    (tmp_path / "site.tsv").write_text(tsv_block)
    n, errors = check_dir(tmp_path)
    assert n == 1 and errors == []
    rs = load_rules([tmp_path])
    assert check_catalog_examples(rs, f"{tmp_path}/") == []
    assert any(r.where.startswith(f"{tmp_path}/") for r in rs.by_id["nccl.socket_error"].rows)


def test_rules_test_refuses_a_relation_to_no_rule(tmp_path):
    _write(tmp_path, "site/thing.yaml", GOOD.replace(
        "role: root", "role: root\nrecasts: {rules: [python.exception, site.nosuch], why: x}"))
    n, errors = check_dir(tmp_path)
    assert n == 1 and errors == ["site/thing.yaml: recasts.rules: 'site.nosuch' is not a loaded rule"]


def test_digit_blind_patterns():
    from sattrib.engine.matcher import digit_blind
    assert digit_blind(r"(?P<n>\d+) bytes in [0-9a-f]+ \S+ \w+\b")
    assert digit_blind(r"SeqNum=(?P<seq>\d+), .*Timeout\(ms\)=(?P<ms>[0-9]+)")
    assert not digit_blind(r"NVRM: Xid .*: 79\b")       # one code, not any
    assert not digit_blind(r"status=[1-3] ")             # some digits, not all
    assert not digit_blind(r"rank [^0] failed")


def _counted_rule(pattern: str, searched: dict, rid: str):
    from sattrib.engine.matcher import compile_rule_pattern, digit_blind
    from sattrib.engine.rules import CompiledRule
    rx, lits, fold = compile_rule_pattern(pattern)
    c = CompiledRule(None, rx, lits, fold, f"{rid}.yaml", digit_blind=digit_blind(pattern))
    plain = c.search

    def search(message, kernel=False):
        searched[rid] = searched.get(rid, 0) + 1
        return plain(message, kernel)
    c.search = search
    return c


def test_each_message_shape_is_searched_once_and_gives_each_line_its_own_groups():
    from sattrib.engine.matcher import ShapeSearch
    searched: dict = {}
    shapes = ShapeSearch({
        "timeout": _counted_rule(r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation "
                                 r"timeout: WorkNCCL\(SeqNum=(?P<seq>\d+)(?P<x>, X)?", searched,
                                 "timeout"),
        "xid79": _counted_rule(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): 79\b", searched,
                               "xid79")})
    caps = []
    for rank, seq in ((3, 17), (5, 42), (7, 99)):
        line = (f"[Rank {rank}] Watchdog caught collective operation timeout: "
                f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE)").encode()
        hit = shapes(line, {"timeout"}, False)
        caps.append(hit["timeout"].groupdict())
    assert caps == [{"rank": "3", "seq": "17", "x": None}, {"rank": "5", "seq": "42", "x": None},
                    {"rank": "7", "seq": "99", "x": None}]
    assert searched == {"timeout": 1}
    # A rule that reads one number is searched on every line, even of the same shape.
    got = [set(shapes(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1".encode(), {"xid79"}, False))
           for code in (79, 31, 79)]
    assert got == [{"xid79"}, set(), {"xid79"}]
    assert searched == {"timeout": 1, "xid79": 3}


ENGINE_DIR = Path(__file__).parent.parent / "engine"


@pytest.mark.parametrize("what,pattern", [
    ("an Xid number", r"\bcode\s*(?:==|!=|in|not in|<=|>=|<|>)\s*[(\d]|\d\s*<=\s*code\b"),
    ("a decoder name", r"\.decode\s*(?:==|!=|in|not in)\s*[\"'(]"),
    ("a rule id", r"\.id\s*(?:==|!=|in|not in)\s*[\"'(]|\bRULE\s*="),
    ("a string tag", r"[\"'][\w:-]+[\"']\s+(?:not )?in\s+\w+\.tags|\.startswith\([\"'][a-z_]+:"),
])
def test_the_engine_keys_on_no(what, pattern):
    """What a line means is data on its rule or catalog row (a decoder's typed tag, a row of
    engine/xid_policy.tsv, a rule's `fact`), never a branch on a literal in engine code."""
    hits = [f"{p.name}:{n}: {line.strip()}" for p in sorted(ENGINE_DIR.glob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(pattern, line)]
    assert not hits, f"engine code keys on {what}:\n" + "\n".join(hits)


def test_relations_between_kinds_of_fault_live_in_one_table():
    """How one kind of fault changes what another means (an Xid 45 alone, a crash before a
    peer's reset) is a row of engine/relations.py or a set in engine/taxonomy.py, never a
    family compared by name inside a stage."""
    family = re.compile(r"""(?:FAMILY\b.*|\bfamily\s*)(?:==|!=|\bin)\s*\(?["'](?:gpu|nvlink|"""
                        r"""network|storage|workload|scheduler)["']""")
    hits = [f"{p.name}:{n}: {line.strip()}" for p in sorted(ENGINE_DIR.glob("*.py"))
            if p.name not in ("relations.py", "taxonomy.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if family.search(line)]
    assert not hits, "a relation inline:\n" + "\n".join(hits)


def test_a_rule_names_a_fact_from_the_closed_set(tmp_path):
    """A stage asks for a fact (`fact: rank_progress`), not for a rule id: a site rule can
    feed it, and a misspelt fact is refused at load."""
    d = tmp_path / "rules" / "site"
    d.mkdir(parents=True)
    rule = ("id: site.progress\ntitle: our launcher's progress line\nrole: context\n"
            "source: stderr\nfact: {fact}\npattern: 'step=(?P<enq>\\d+)'\nexplain: progress\n"
            "examples:\n  match:\n    - line: 'step=4'\n")
    (d / "progress.yaml").write_text(rule.format(fact="rank_progress"))
    rs = load_rules([tmp_path / "rules"], builtin=False, cache=False)
    assert rs.by_id["site.progress"].rule.fact == "rank_progress"
    (d / "progress.yaml").write_text(rule.format(fact="rank_progres"))
    with pytest.raises(RuleError, match="site/progress.yaml: fact: "):
        load_rules([tmp_path / "rules"], builtin=False, cache=False)


@pytest.mark.parametrize("fact", ["gpu_identity", "probe_failed", "rank_progress",
                                  "collective_timeout", "desync_report", "flight_recorder",
                                  "peer_dead", "util_fell_first"])
def test_every_fact_is_named_by_a_builtin_rule(fact):
    assert any(c.rule.fact == fact for c in load_rules().rules)

"""The message catalogs: every row is checked by `check_catalog_examples` (its example is a hit
of its rule, classified by that very row); every emitter lists what it deliberately left out and
why; every row names its emitter, the version read and why it means what it says."""
from pathlib import Path

import pytest

from sattrib.engine.catalog import BUILTIN_DIR, catalog_files
from sattrib.engine.lineparse import clean, split_prefix
from sattrib.engine.rules import check_catalog_examples

OMITTED = sorted(BUILTIN_DIR.glob("*.omitted.txt"))


def emitter_of(path: Path) -> str:
    """nccl_socket.tsv and nccl_cuda.tsv are parts of the NCCL catalog, and so on."""
    return path.name.split(".")[0].split("_")[0]


def test_every_row_is_classified_by_itself(rules):
    assert check_catalog_examples(rules, "catalogs/") == []
    assert sum(len(c.rows) for c in rules.rules) >= 600


def test_kernel_rows_read_from_the_start_of_the_message(rules):
    """Kernel records quote users' names mid-line (`traps: x[1] ... in <file>`, audit's
    `exe="<path>"`): the generic kernel catalog's rows match only at the start of the message
    (or after the device it names first), never on the same words quoted further on."""
    rule = rules.by_id["host.kernel_msg"]
    rows = [row for row in rule.rows if row.where.startswith("catalogs/kernel.tsv")]
    assert len(rows) >= 40
    for row in rows:
        msg = rule.search(split_prefix(clean(row.example)).message, True).group("msg")
        assert row.search(msg), row.where
        assert not row.search(f'audit: type=1400 audit(0.0:1): exe="{msg}"'), row.where


def test_every_row_names_its_emitter_and_version(rules):
    for c in rules.rules:
        for row in c.rows:
            assert len(row.emitter) >= 5 and row.version and row.note, row.where


def test_every_emitter_lists_what_it_left_out():
    emitters = {emitter_of(p) for p in catalog_files(BUILTIN_DIR)}
    listed = {p.name.split(".")[0] for p in OMITTED}
    assert emitters - {"cuda", "nccl"} <= listed | {"errno"}
    assert {"nccl", "cuda", "errno", "slurm", "nvrm", "kernel"} <= listed


@pytest.mark.parametrize("path", OMITTED, ids=lambda p: p.name)
def test_left_out_messages_each_say_why(path):
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines
    for ln in lines:
        message, _, why = ln.partition("\t")
        assert message.strip() and len(why.strip()) >= 8, ln


def test_coverage_summary(rules, capsys):
    """Not an assertion of numbers: prints rows and left-out messages per emitter (pytest -s)."""
    rows: dict[str, int] = {}
    for c in rules.rules:
        for row in c.rows:
            rows[emitter_of(Path(row.where.split(":")[0]))] = rows.get(
                emitter_of(Path(row.where.split(":")[0])), 0) + 1
    left = {p.name.split(".")[0]: sum(1 for ln in p.read_text().splitlines()
                                      if ln.strip() and not ln.startswith("#")) for p in OMITTED}
    for em in sorted(set(rows) | set(left)):
        print(f"{em:10} {rows.get(em, 0):5} rows {left.get(em, 0):4} left out")
    assert rows and left

"""Where a hang stopped: PyTorch's NCCL flight-recorder dumps, read safely and across ranks.

The four recorded 16-rank hangs of nvidia-resiliency-ext (tests/data/flight_recorder, ground
truth in each _fault_injection.log) and dumps written in the same format for the shapes they
lack (tests/fr_dumps.py): a rank missing its dump, a pipeline stall, a rank ahead of the rest,
one node's eight ranks, ranks waiting for each other, 1,024 ranks; hostile dumps; determinism;
the node's shipped facts; the text and the dashboard's page."""
import json
import os
import pickle
import re
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest

from fr_dumps import Job
from sattrib.analysis import analyze_folder, load_rules
from sattrib.collectors import flight_recorder
from sattrib.render import render

DATA = Path(__file__).parent / "data" / "flight_recorder"
SCENARIOS = ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"]


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def injected(scenario: str) -> set:
    text = (DATA / scenario / "_fault_injection.log").read_text()
    return {int(r) for r in re.search(r"Fault ranks: \[([\d, ]+)\]", text).group(1).split(",")}


def diagnose(folder, rules):
    d, _ = analyze_folder(folder, rules=rules)
    return d


def as_json(d) -> str:
    return json.dumps(d.model_dump(mode="json"), sort_keys=True)


# -- the reader ------------------------------------------------------------------------------
def test_a_dump_becomes_how_far_the_rank_got_in_each_group():
    got = flight_recorder.read_one(str(DATA / "gpu_error_1st" / "node-02" / "_dump_12"), None,
                                   flight_recorder.MAX_BYTES)
    assert (got["rank"], got["version"], got["entries"], got["notes"]) == (12, "2.9", 27, [])
    ep = {g["pg"]: g for g in got["groups"]}["74"]
    assert (ep["desc"], ep["ranks"]) == ("EXPERT_MODEL_PARALLEL_GROUP", [12, 13, 14, 15])
    # scheduled and completed from pg_status (pg_id 11), the runs in flight from the entries
    assert (ep["scheduled"], ep["completed"]) == (20536, 20529)
    assert ep["pending"] == [[20530, 20536, "all_to_all", "scheduled"]]
    pp = {g["pg"]: g for g in got["groups"]}["43"]           # [0, 4, 8, 12]: sends, receives
    assert pp["scheduled"] is None and pp["p2p"] == [               # kind, peer, first seq, n
        ["recv", 0, 11977, 1, "scheduled"], ["recv", 8, 11979, 1, "scheduled"],
        ["send", 0, 11980, 1, "scheduled"], ["send", 8, 11978, 1, "scheduled"]]


def test_the_json_form_of_a_dump_reads_the_same(tmp_path):
    job = Job(4, only_active=False)
    job.at("0", range(4), 12, 10)
    dump = job.dump(1)
    pickled, js = tmp_path / "nccl_trace_rank_1", tmp_path / "json" / "nccl_trace_rank_1"
    pickled.write_bytes(pickle.dumps(dump, protocol=2))
    js.parent.mkdir()
    # PyTorch's JSON dump: strings for the pg_status numbers, lists for tuples
    dump["pg_status"] = {k: {f: str(v) for f, v in s.items()} for k, s in dump["pg_status"].items()}
    js.write_text(json.dumps(dump))
    one, two = (flight_recorder.read_one(str(p), None, flight_recorder.MAX_BYTES)
                for p in (pickled, js))
    assert one == two and one["groups"][0]["pending"] == [[11, 12, "all_reduce", "scheduled"]]


# -- the four recorded scenarios --------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recorded_hang_names_the_injected_ranks_and_their_node(scenario, rules):
    d = diagnose(DATA / scenario, rules)
    loc = d.localization
    assert set(loc.ranks) == injected(scenario), loc.how
    assert loc.nodes == ["node-02"]
    # nothing proves why: the outcome stays unattributed, and says where to look
    assert d.outcome.value == "unattributed" and d.action_code.value == "inspect_node"
    assert d.explanation.startswith("The job stopped at rank") and \
        "nothing says why: check that node" in d.explanation
    cited = [e for e in d.evidence if e.id in loc.evidence]
    assert len(cited) == len(loc.evidence) >= 2
    assert {e.rule for e in cited} == {"torch.flight_recorder"}
    assert {e.node for e in cited} == {"node-02"} and all(e.trust.value == "job_output"
                                                          for e in cited)
    assert f"flight_recorder:node-01" in d.completeness.present


def test_the_four_scenarios_score_at_least_7_of_8_injected_ranks_and_no_other(rules):
    named = hit = wrong = 0
    for s in SCENARIOS:
        ranks = set(diagnose(DATA / s, rules).localization.ranks)
        hit += len(ranks & injected(s))
        wrong += len(ranks - injected(s))
        named += len(injected(s))
    assert (hit, wrong) == (8, 0), (hit, named, wrong)


def test_what_each_scenario_says(rules):
    how = {s: diagnose(DATA / s, rules).localization.how for s in SCENARIOS}
    assert how["gpu_error_1st"].startswith("the job stopped at rank 12 (node-02): 7 ranks "
                                           "waited for it")
    assert "it never scheduled it (last scheduled: #" in how["gpu_error_1st"]
    assert ("rank 14 (node-02) never saw complete 13 collectives its peers completed"
            in how["gpu_error_1st"])
    assert how["gpu_error_2nd"].startswith("the job stopped at ranks 9,14 (node-02)")
    assert how["lock_gil_1st"].startswith("the job stopped at ranks 9,14 (node-02): 14 ranks "
                                          "waited for them")
    assert "they recorded nothing in flight" in how["lock_gil_1st"]
    assert "and at rank 15 (node-02)" in how["lock_gil_2nd"]


def test_same_dumps_give_a_byte_identical_diagnosis(tmp_path, rules):
    first = as_json(diagnose(DATA / "gpu_error_1st", rules))
    # the same files, written in the reverse order under other inode numbers
    copy = tmp_path / "copy"
    files = sorted((DATA / "gpu_error_1st").rglob("*"), reverse=True)
    for f in files:
        if f.is_file():
            dest = copy / f.relative_to(DATA / "gpu_error_1st")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    assert as_json(diagnose(copy, rules)) == first == as_json(
        diagnose(DATA / "gpu_error_1st", rules))


def test_lines_in_any_order_and_the_plain_reading_give_the_same_diagnosis(rules):
    """The reader's lines and documents shuffled, and the reference reading (no prefilter,
    every rule on every line, one process): the same JSON."""
    import random

    from sattrib.collectors.evidence_folder import FolderReader
    from sattrib.engine.pipeline import diagnose as run
    folder = DATA / "lock_gil_2nd"
    want = run(FolderReader(rules).read(folder), rules, engine_version="t").model_dump_json()
    for seed in (1, 2):
        bundle = FolderReader(rules).read(folder)
        random.Random(seed).shuffle(bundle.lines)
        random.Random(seed).shuffle(bundle.documents)
        assert run(bundle, rules, engine_version="t").model_dump_json() == want
    plain = FolderReader(rules, reference=True).read(folder)
    assert run(plain, rules, engine_version="t").model_dump_json() == want


def test_the_text_says_where_the_job_stopped(rules, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    d = diagnose(DATA / "lock_gil_1st", rules)
    text = render(d.model_dump(mode="json"))
    assert "Stopped at: ranks 9, 14 on node-02" in text
    flowing = " ".join(text.split())                  # the text wraps at 80 columns
    assert "node-02/_dump_" in text and "recorded nothing in flight" in flowing


# -- shapes the recordings lack --------------------------------------------------------------
def slurm(folder: Path, world: int, per_node: int = 8) -> Path:
    """A scheduler record: the task layout places ranks whose dump is missing."""
    nodes = world // per_node
    (folder / "slurm").mkdir(parents=True, exist_ok=True)
    (folder / "slurm" / "job.txt").write_text(
        f"JobId=77 JobState=FAILED ExitCode=1:0\n   NodeList=node-[01-{nodes:02d}] "
        f"NumNodes={nodes} NumTasks={world}\n   NtasksPerN:B:S:C={per_node}:0:*:*\n")
    return folder


def stuck_at_5(only_active=True) -> Job:
    job = Job(16, only_active=only_active)
    job.at("0", range(16), 100, 99)
    job.at("0", [5], 99, 99)
    return job


def test_a_rank_that_never_scheduled_the_collective(tmp_path, rules):
    d = diagnose(stuck_at_5(only_active=False).write(tmp_path), rules)
    assert (d.localization.ranks, d.localization.nodes) == ([5], ["node-01"])
    assert d.localization.how == ("the job stopped at rank 5 (node-01): 15 ranks waited for it "
                                  "in all_reduce #100 of default_pg; it never scheduled it "
                                  "(last scheduled: #99)")


def test_a_rank_missing_its_dump_counts_as_stopped_and_says_so(tmp_path, rules):
    d = diagnose(slurm(stuck_at_5().write(tmp_path, skip={5}), 16), rules)
    assert (d.localization.ranks, d.localization.nodes) == ([5], ["node-01"])
    assert "it left no flight-recorder dump" in d.localization.how


def test_a_rank_ahead_of_the_others_is_the_odd_one(tmp_path, rules):
    job = Job(16)
    job.at("0", range(16), 100, 99)
    job.at("0", [5], 101, 99)                       # it went on into a collective alone
    d = diagnose(job.write(tmp_path), rules)
    assert d.localization.ranks == [5]
    assert d.localization.how == ("rank 5 (node-01) entered all_reduce #101 of default_pg, "
                                  "which the other 15 ranks of that group never entered")


def test_a_hang_on_one_nodes_eight_ranks(tmp_path, rules):
    job = Job(32)
    job.at("0", range(32), 100, 99)
    job.at("0", range(16, 24), 99, 99)
    d = diagnose(job.write(tmp_path), rules)
    assert (d.localization.ranks, d.localization.nodes) == (list(range(16, 24)), ["node-03"])
    assert "24 ranks waited for them in all_reduce #100 of default_pg" in d.localization.how


def test_a_pipeline_stall_in_point_to_point_sends_and_receives(tmp_path, rules):
    """Two pipelines of four stages; rank 2 stops in its compute: stage 1 waits to send to it,
    stage 3 to receive from it, and its data-parallel peer 6 waits in an all_reduce it never
    scheduled. Stage 0 and stage 1 exchange normally (both posted)."""
    job = Job(8)
    job.group("pp0", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    job.group("pp1", "PIPELINE_MODEL_PARALLEL_GROUP", [4, 5, 6, 7])
    for i in range(4):
        job.group(f"dp{i}", "DATA_PARALLEL_GROUP", [i, i + 4])
        job.at(f"dp{i}", [i, i + 4], 50, 49)
        job.at(f"dp{i}", [i], 49, 49)
    job.waits("pp0", 1, "send", 2)
    job.waits("pp0", 3, "recv", 2)
    job.waits("pp0", 0, "send", 1)
    job.waits("pp0", 1, "recv", 0)
    d = diagnose(job.write(tmp_path), rules)
    assert d.localization.ranks == [2], d.localization.how
    assert d.localization.how.startswith("the job stopped at rank 2 (node-01): 5 ranks waited")


def test_two_ranks_waiting_for_each_other_are_both_named(tmp_path, rules):
    job = Job(4)
    job.group("a", "GROUP_A", [0, 1])
    job.group("b", "GROUP_B", [0, 1])
    job.at("a", [0], 10, 9)
    job.at("a", [1], 9, 9)
    job.at("b", [1], 10, 9)
    job.at("b", [0], 9, 9)
    d = diagnose(job.write(tmp_path), rules)
    assert d.localization.ranks == [0, 1]
    assert d.localization.how == ("ranks 0-1 (node-01) wait for each other (in all_reduce #10 "
                                  "of GROUP_A, all_reduce #10 of GROUP_B)")


def test_a_rank_whose_gpu_never_started_what_all_scheduled(tmp_path, rules):
    job = Job(8)
    job.at("0", range(8), 100, 99, started=100)
    job.at("0", [3], 100, 99, started=99)
    d = diagnose(job.write(tmp_path), rules)
    assert d.localization.ranks == [3]
    assert "it scheduled it, but the GPU never started it" in d.localization.how


def test_no_rank_is_named_that_the_dumps_do_not_single_out(tmp_path, rules):
    job = Job(16)
    job.at("0", range(16), 100, 99)
    job.at("0", range(7), 99, 99)          # 7 stopped, 9 wait: fine
    assert diagnose(job.write(tmp_path / "a"), rules).localization.ranks == list(range(7))
    job = Job(16)
    job.at("0", range(16), 100, 99)
    job.at("0", range(5), 99, 99)          # two groups disagree: 5 stopped in one...
    job.group("x", "OTHER", list(range(16)))
    job.at("x", range(16), 7, 6)
    job.at("x", range(8, 16), 6, 6)        # ...8 others in another: 13 of 16, not one place
    d = diagnose(job.write(tmp_path / "b"), rules)
    assert d.localization is None
    assert any("do not single out where the job stopped (13 of 16 ranks" in n
               for n in d.completeness.notes)


def test_1024_ranks(tmp_path, rules):
    job = Job(1024)
    for n in range(128):
        job.group(f"tp{n}", "TENSOR_MODEL_PARALLEL_GROUP", list(range(8 * n, 8 * n + 8)))
        job.at(f"tp{n}", range(8 * n, 8 * n + 8), 300, 300)
    job.at("0", range(1024), 40, 39)
    job.at("0", [517], 39, 39)
    job.at("tp64", range(512, 520), 301, 300)
    job.at("tp64", [517], 300, 300)
    d = diagnose(slurm(job.write(tmp_path), 1024), rules)
    assert (d.localization.ranks, d.localization.nodes) == ([517], ["node-65"])
    assert "1023 ranks waited for it" in d.localization.how


# -- a cause found elsewhere --------------------------------------------------------------------
def test_a_proven_cause_on_the_stopped_node_is_the_root_and_the_localization_stays(
        tmp_path, rules):
    folder = tmp_path / "job"
    shutil.copytree(DATA / "gpu_error_1st", folder)
    (folder / "node-02" / "journal.log").write_text(
        "2025-09-23T06:52:10+0000 node-02 kernel: NVRM: Xid (PCI:0000:9d:00): 79, pid=0, "
        "name=python, GPU has fallen off the bus.\n")
    d = diagnose(folder, rules)
    assert (d.outcome.value, d.root_cause.category.value, d.root_cause.node) == (
        "attributed", "gpu_hardware", "node-02")
    assert d.localization.ranks == [12, 14] and d.localization.nodes == ["node-02"]
    assert "nothing says why" not in d.explanation


def test_other_sources_localize_without_dumps(tmp_path, rules):
    """The desync report decides when there are no dumps; where dumps exist, the report that
    agrees with them adds its line, and one that points elsewhere is named."""
    folder = tmp_path / "job"
    (folder / "node-01").mkdir(parents=True)
    report = ("[rank0]:[E0923 06:55:05.085 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg)"
              " Rank 0] Timeout at collective: ALLREDUCE, #100\n"
              "\t - To our best knowledge, ranks [5] are the lagging ranks that caused this "
              "timeout. They never joined any collectives\n")
    (folder / "node-01" / "rank-0.err").write_text(report)
    d = diagnose(folder, rules)
    assert d.localization.ranks == [5]
    assert d.localization.how.startswith("PyTorch's desync report names rank 5 as the lagging")
    both = tmp_path / "both"
    stuck_at_5().write(both)
    (both / "node-01" / "rank-0.err").write_text(report)
    d = diagnose(both, rules)
    assert d.localization.ranks == [5] and "instead" not in d.localization.how
    assert "torch.desync_report" in {e.rule for e in d.evidence if e.id in d.localization.evidence}
    (both / "node-01" / "rank-0.err").write_text(report.replace("[5]", "[3]"))
    d = diagnose(both, rules)
    assert d.localization.ranks == [5]
    assert d.localization.how.endswith("; the desync report points at rank 3 (node-01) instead")


# -- hostile and broken dumps ---------------------------------------------------------------
def _hostile() -> dict:
    """name -> (bytes, or a function making the file at a path)."""
    def big(path):                               # a 1 GiB string: a sparse file, never read
        with open(path, "wb") as f:
            f.write(b"\x80\x02X" + struct.pack("<I", 1 << 30))
            f.truncate((1 << 30) + 7)

    def fifo(path):
        os.mkfifo(path)

    def link(path):              # a link is never followed: like no file (rank 99 is in no group)
        path.with_name("nccl_trace_rank_99").symlink_to("/etc/shadow")
        path.write_bytes((DATA / "gpu_error_1st" / "node-01" / "_dump_0").read_bytes())
    deep = b"\x80\x02}X\x07\x00\x00\x00entries]" + b"]" * 500_000 + b"a" * 500_000 + b"s."
    # dict keys that all hash alike (multiples of 2**61 - 1): the C unpickler is quadratic
    colliding = b"\x80\x02}(" + b"".join(
        b"\x8a\x10" + (k * ((1 << 61) - 1)).to_bytes(16, "little", signed=True) + b"N"
        for k in range(1, 60_000)) + b"u."
    return {
        "class": b"cos\nsystem\n(S'touch /tmp/sattrib-pwned'\ntR.",
        "persistent id": b"\x80\x02X\x01\x00\x00\x00aQ.",
        "claimed 1 GiB string": b"\x80\x02X" + struct.pack("<I", 1 << 30) + b"abc",
        "1 GiB file": big,
        "deep nesting": deep,
        "memo index": b"\x80\x02}r\xff\xff\xff\x7f.",
        "colliding keys": colliding,
        "not a dict": pickle.dumps([1, 2, 3], protocol=2),
        "truncated": pickle.dumps(stuck_at_5().dump(0), protocol=2)[:300],
        "json too deep": b'{"pg_config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "fifo": fifo,
        "symlink": link,
    }


@pytest.fixture(scope="module")
def baseline(rules):
    return diagnose(DATA / "gpu_error_1st", rules)


@pytest.mark.parametrize("kind", list(_hostile()))
def test_a_hostile_dump_changes_nothing_but_a_note(kind, tmp_path, rules, baseline,
                                                   monkeypatch):
    monkeypatch.setattr(flight_recorder, "PER_FILE_S", 2.0)
    folder = tmp_path / "job"
    shutil.copytree(DATA / "gpu_error_1st", folder)
    target = folder / "node-01" / "_dump_0"         # rank 0: nobody waits on it
    target.unlink()
    make = _hostile()[kind]
    if callable(make):
        make(target)
    else:
        target.write_bytes(make)
    t0 = time.monotonic()
    d = diagnose(folder, rules)
    assert time.monotonic() - t0 < 60
    assert not Path("/tmp/sattrib-pwned").exists()
    got, want = d.model_dump(mode="json"), baseline.model_dump(mode="json")
    notes = got["completeness"].pop("notes")
    want["completeness"].pop("notes")
    assert got == want
    assert any(("nccl_trace_rank_99" if kind == "symlink" else "_dump_0") in n
               for n in notes), notes


def test_a_dump_the_reader_gives_up_on_is_said_in_one_note(tmp_path, monkeypatch):
    monkeypatch.setattr(flight_recorder, "PER_FILE_S", 1.0)
    slow = tmp_path / "nccl_trace_rank_3"
    slow.write_bytes(_hostile()["colliding keys"])
    fine = tmp_path / "nccl_trace_rank_4"
    fine.write_bytes(pickle.dumps(stuck_at_5().dump(4), protocol=2))
    t0 = time.monotonic()
    got = flight_recorder.read_all([str(slow), str(fine)], None, flight_recorder.MAX_BYTES,
                                   time.monotonic() + 30)
    assert time.monotonic() - t0 < 10
    assert got[0] == {"rank": 3, "note": "not read: reading it took longer than 1 s or more "
                                         "than 1024 MiB"}
    assert got[1]["rank"] == 4 and got[1]["groups"]                 # the next one is read


@pytest.mark.skipif(os.geteuid() != 0, reason="gives up root for the job's user")
def test_a_dump_is_read_as_the_jobs_user():
    """As root (a node's Epilog), the reading child becomes the job's user before it opens the
    dump and loads no module after that: the user may not be able to read the Python
    installation, and a module loaded late would lose every dump (each read then as "too slow")."""
    nobody = 65534
    folder = Path(tempfile.mkdtemp(prefix="sattrib-fr-"))       # pytest's own are root's only
    folder.chmod(0o755)
    dump = folder / "nccl_trace_rank_4"
    dump.write_bytes(pickle.dumps(stuck_at_5().dump(4), protocol=2))
    os.chown(dump, nobody, nobody)
    got = flight_recorder.read_all([str(dump)], nobody, flight_recorder.MAX_BYTES,
                                   time.monotonic() + 30, as_user=(nobody, nobody))
    assert got[0]["rank"] == 4 and got[0].get("groups"), got
    dump.chmod(0o600)
    os.chown(dump, 0, 0)                      # root's file: the job's user cannot open it
    got = flight_recorder.read_all([str(dump)], None, flight_recorder.MAX_BYTES,
                                   time.monotonic() + 30, as_user=(nobody, nobody))
    shutil.rmtree(folder)
    assert "groups" not in got[0] and "ermission" in got[0]["note"], got


# -- the node's facts instead of its dumps --------------------------------------------------------
def test_the_facts_a_node_ships_give_the_same_localization(tmp_path, rules):
    """What each node's Epilog ships (collectors/flight_recorder.ship: the dumps read there)
    in place of the dumps gives the same answer, on lines that name the dumps."""
    src = DATA / "gpu_error_1st"
    shipped = tmp_path / "shipped"
    shutil.copytree(src / "slurm", shipped / "slurm")
    for node in ("node-01", "node-02"):
        paths = sorted(str(p) for p in (src / node).glob("_dump_*"))
        got = flight_recorder.read_all(paths, None, flight_recorder.MAX_BYTES,
                                       time.monotonic() + 60)
        (shipped / node).mkdir()
        (shipped / node / flight_recorder.FACTS_NAME).write_text(
            flight_recorder.facts_text([dict(r, source=p) for p, r in zip(paths, got)]))
    raw, facts = diagnose(src, rules), diagnose(shipped, rules)
    assert facts.localization.model_dump() | {"evidence": None} == \
        raw.localization.model_dump() | {"evidence": None}
    cited = [e for e in facts.evidence if e.id in facts.localization.evidence]
    assert {e.path for e in cited} == {"node-02/flight-recorder.json"}
    assert all(e.text.startswith(str(src / "node-02" / "_dump_")) for e in cited)


# -- the dashboard ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hang_db(tmp_path_factory, rules):
    from sattrib.store import Store
    path = tmp_path_factory.mktemp("hang") / "diagnoses.db"
    store = Store(path)
    store.upsert(diagnose(DATA / "gpu_error_1st", rules), "test",
                 bundle_path=str(DATA / "gpu_error_1st"))
    store.sync_rules(rules)
    return path


def test_the_diagnosis_page_says_where_the_job_stopped(hang_db):
    from test_dashboard import get
    rc, html = get(hang_db, "/diagnosis/test/4101/0")
    assert rc == 0
    where = html.split("<h2>Where the job stopped</h2>")[1].split("<h2>")[0]
    assert "<strong>ranks 12, 14</strong>" in where
    assert 'href="/diagnoses/node_history?node=node-02"' in where
    assert "the job stopped at rank 12 (node-02): 7 ranks waited for it" in where
    assert re.findall(r'<a href="#(e\d+)">', where) == ["e1", "e2", "e3", "e4"]
    assert all(f'id="e{i}"' in html for i in range(1, 5))     # the timeline rows they point at


@pytest.mark.browser
def test_browser_diagnosis_page_shows_where_the_job_stopped(hang_db):
    from playwright.sync_api import sync_playwright
    from test_dashboard import ARTIFACTS, LAPTOP, _Served, launch_chromium, need_chromium
    need_chromium()
    with _Served(hang_db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/diagnosis/test/4101/0")
        where = page.locator("#where")
        assert where.is_visible()
        text = where.inner_text()
        assert "ranks 12, 14 on node-02" in text
        assert "never saw complete 13 collectives its peers completed" in text
        box = where.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= LAPTOP["width"]
        where.locator('a[href="#e3"]').click()                 # to the evidence line it cites
        assert page.locator("tr#e3").is_visible()
        assert "node-02/_dump_14" in page.locator("tr#e3").inner_text()
        where.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "diagnosis-where-stopped.png"))
        where.locator('a[href="/diagnoses/node_history?node=node-02"]').click()
        page.wait_for_url(re.compile(r"/diagnoses/node_history\?node=node-02$"))
        browser.close()


def test_dumps_from_before_the_job_are_left_out_with_a_note(tmp_path, rules):
    """A dump's time is when its rank last enqueued work (its entries' own stamps, not the
    file's, which a copy resets): one left in /tmp by an earlier job is not this job's."""
    folder = tmp_path / "job"
    shutil.copytree(DATA / "gpu_error_1st", folder)
    job = folder / "slurm" / "job.txt"
    job.write_text(job.read_text().replace("2025-09-23T06:50:05", "2025-09-24T06:50:05")
                   .replace("2025-09-23T07:06:05", "2025-09-24T07:06:05"))
    d = diagnose(folder, rules)
    assert d.localization is None
    assert any(n.startswith("node-02/_dump_12: events before the job's time window ignored")
               for n in d.completeness.notes)


def test_a_node_ships_the_facts_of_the_jobs_own_recent_dumps(tmp_path):
    """collectors/flight_recorder.ship as the node Epilog calls it: the globs' %j and %N, only
    dumps written after the job started, their facts in one file; no time left, nothing."""
    from types import SimpleNamespace
    job = SimpleNamespace(job_id="77", user="alice", node="n1", uid=os.getuid(),
                          start=time.time() - 600)
    d = tmp_path / "77" / "n1"
    d.mkdir(parents=True)
    for r in (4, 5):
        (d / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(stuck_at_5().dump(r), protocol=2))
    os.utime(d / "nccl_trace_rank_4", (time.time() - 3600,) * 2)       # before the job
    notes: list = []
    text = flight_recorder.ship([f"{tmp_path}/%j/%N/nccl_trace_rank_*"], job,
                                flight_recorder.MAX_BYTES, time.monotonic() + 30, notes)
    dumps, more = flight_recorder.read_facts(text.encode())
    assert [(x["rank"], x["source"]) for x in dumps] == [(5, str(d / "nccl_trace_rank_5"))]
    assert notes == more == [] and text.startswith('{"format": "sattrib-flight-recorder/1"')
    assert flight_recorder.ship(["/nonexistent/*"], job, 1, time.monotonic() + 30, notes) is None
    assert notes == []
    assert flight_recorder.ship([f"{tmp_path}/%j/%N/*"], job, 1, time.monotonic(), notes) is None
    assert notes == ["flight-recorder dumps not looked for: no time left in the Epilog's budget"]


def test_the_progress_counters_and_nccl_ras_localize_without_dumps(tmp_path, rules):
    """Each rank's watchdog line says how far it enqueued: the one behind is where the job
    stopped. NCCL RAS declaring a node's peer dead says which node."""
    folder = tmp_path / "job"
    for r in range(4):
        node = folder / f"h{r // 2 + 1}"
        node.mkdir(parents=True, exist_ok=True)
        enq = 99 if r == 2 else 100
        (node / f"rank-{r}.err").write_text(
            f"[rank{r}]:[E0309 09:47:15.652118767 ProcessGroupNCCL.cpp:2101] [PG ID 0 PG GUID "
            f"0(default_pg) Rank {r}] Exception (either an error or timeout) detected by "
            f"watchdog at work: {enq}, last enqueued NCCL work: {enq}, last completed NCCL "
            f"work: 98.\n")
    d = diagnose(folder, rules)
    assert (d.localization.ranks, d.localization.nodes) == ([2], ["h2"])
    assert d.localization.how.startswith("the ranks' progress counters show rank 2 (h2) behind")
    ras = tmp_path / "ras"
    (ras / "h1").mkdir(parents=True)
    (ras / "h2").mkdir(parents=True)
    (ras / "h1" / "rank-0.err").write_text(
        "h1:2211:2290 [0] NCCL INFO RAS declaring peer h2<28028> as DEAD; rasConnCount 1\n")
    d = diagnose(ras, rules)
    assert (d.localization.ranks, d.localization.nodes) == ([], ["h2"])
    assert d.localization.how == "NCCL RAS declared h2 dead or unresponsive"

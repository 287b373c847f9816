"""The evidence-source registry (collectors/sources.py): one row per kind and per file sattrib
writes into a bundle, and the places that name sources read it."""
import json

from helpers import folder
from sattrib.analysis import analyze_folder, reading_summary
from sattrib.collectors import probes_file, sources
from sattrib.collectors.sources import Read, Where
from sattrib.engine.taxonomy import Kind


def test_every_kind_has_one_row_and_a_label():
    kinds = [r.kind for r in sources.ROWS if r.kind is not None]
    assert sorted(kinds) == sorted(Kind) and len(kinds) == len(set(kinds))
    assert all(sources.label(k) for k in Kind)


def test_rows_that_count_as_one_source_agree_on_how():
    by_name: dict = {}
    for r in sources.ROWS:
        if r.counts is not None:
            by_name.setdefault(r.counts.name, set()).add(r.counts)
    assert all(len(c) == 1 for c in by_name.values()), by_name
    assert by_name["kernel"] == {sources.KERNEL} and by_name["scheduler"] == {sources.SCHEDULER}


def test_every_file_sattrib_writes_into_a_bundle_is_a_row():
    """Manifests are never evidence; sattrib's own evidence files are read by their row."""
    assert sources.RESERVED == {"slurm", "logs", "diagnosis.json", "actions.json",
                                "expected.json"}
    assert sources.manifest("actions.json").read == Read.skip
    assert sources.manifest("slurm/collect-notes.txt").read == Read.notes
    assert sources.manifest("node-01/actions.json") is None        # a node may hold its own
    own = {"sattrib-run.json": (Where.slurm, Kind.run_record),
           probes_file.NAME: (Where.node, Kind.probes),
           "metrics.json": (Where.node, Kind.metrics)}
    for name, (where, kind) in own.items():
        assert sources.classify(name, b"{}", where).kind == kind
    facts = b'{"format": "sattrib-flight-recorder/1", "dumps": []}\n'
    assert sources.classify("flight-recorder.json", facts, Where.node).kind == \
        Kind.flight_recorder_facts
    # The scheduler's record counts as the scheduler's; sattrib's own record of the run does not.
    assert sources.COUNTING[Kind.slurm_json].name == "scheduler"
    assert Kind.run_record not in sources.COUNTING


def test_node_probes_name_the_source_they_stand_for():
    assert [sources.source_of_probe(p) for p in ("journalctl", "dmesg", "nvidia-smi", "dcgmi",
                                                 "prometheus", "something-else")] == \
        ["kernel", "kernel", "gpu", "dcgm", "metrics", "something-else"]
    text = probes_file.render([{"name": "nvidia-smi", "ok": False, "reason": "timed out",
                                "seconds": 8.0}], "owner uid 0", None, None,
                              sources.source_of_probe)
    assert text.startswith("probe=nvidia-smi source=gpu ok=false reason=timed out")


def test_the_node_snapshot_takes_the_kernel_log_first():
    takes = sources.takes()
    assert takes[0].counts is sources.KERNEL
    assert set(sources.SNAPSHOT_SOURCES) == {"kernel", "gpu", "ib", "dcgm"}
    assert sources.kernel_files() == {"journal.jsonl", "dmesg.txt"}


def test_completeness_entries_say_what_the_strings_say(tmp_path):
    """The typed entries carry the same facts as `present`, `missing` and `failed_probes`, and
    the worker's record of which snapshots came; the reading summary labels by the rows."""
    run = {"job_id": "77", "sattrib_run": True, "nodes": "n[1-2]",
           "snapshots": [{"node": "n1", "state": "present"},
                         {"node": "n2", "state": "missing", "reason": "Slurm reports it down"}]}
    root = folder(tmp_path / "job", {
        "slurm/sattrib-run.json": json.dumps(run),
        "slurm/job.txt": "JobId=77 JobState=FAILED ExitCode=1:0 NodeList=n[1-2]\n",
        "n1/journal.log": "2026-01-01T00:00:00+0000 n1 kernel: hello\n",
        "n1/sattrib-probes.txt": "probe=nvidia-smi source=gpu ok=false reason=exit 9 "
                                 "seconds=0.10\nsnapshot trusted by owner uid 0\n",
        "logs/slurm-77.out": "hello\n"})
    d, bundle = analyze_folder(root)
    c = d.completeness
    tag = {(e.source, e.node): e for e in c.entries if e.state != "probe_failed"}
    assert sorted(f"{s}:{n or 'job'}" for (s, n), e in tag.items()
                  if e.state == "present" and s != "snapshot") == c.present
    assert sorted(f"{s}:{n or 'job'}" for (s, n), e in tag.items()
                  if e.state == "missing" and s != "snapshot") == c.missing
    assert "scheduler:job" in c.present and "gpu:n1" in c.missing and "kernel:n2" in c.missing
    assert (tag[("gpu", "n1")].probe, tag[("gpu", "n1")].reason) == ("nvidia-smi", "exit 9")
    assert [(e.probe, e.node, e.reason) for e in c.entries if e.state == "probe_failed"] == \
        [("nvidia-smi", "n1", "exit 9")] and c.failed_probes == ["nvidia-smi:n1 exit 9"]
    assert (tag[("snapshot", "n1")].state, tag[("snapshot", "n2")].state,
            tag[("snapshot", "n2")].reason) == ("present", "missing", "Slurm reports it down")
    assert reading_summary(bundle).startswith(
        "Read 5 files (") and "2 scheduler" in reading_summary(bundle)


def test_a_persons_notes_beside_the_evidence_are_not_evidence(tmp_path):
    """README*, NOTES* and *.md are what someone wrote about the failure (perhaps its answer),
    wherever they are in the folder: an Xid 79 in them changes nothing."""
    evidence = {"slurm/job.txt": "JobId=5 JobState=FAILED ExitCode=1:0 NodeList=node-01\n",
                "node-01/journal.log": "2026-01-01T00:00:00+0000 node-01 kernel: hello\n",
                "logs/slurm-5.out": "RuntimeError: CUDA error: unknown error\n"}
    xid = "2026-01-01T00:00:01+0000 node-01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, " \
          "GPU has fallen off the bus.\n"
    notes = {"NOTES.md": xid, "node-01/NOTES.md": xid, "node-01/README": xid,
             "node-01/notes.txt": xid, "logs/answer.md": xid, "slurm/README.txt": xid}
    plain, _ = analyze_folder(folder(tmp_path / "a" / "job", evidence))
    noted, bundle = analyze_folder(folder(tmp_path / "b" / "job", {**evidence, **notes}))
    assert noted.model_dump_json() == plain.model_dump_json()
    assert not any(d.path in notes for d in bundle.documents)

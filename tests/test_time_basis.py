"""One time basis: `sattrib list` and `hotspots` filter on when the job ended (its diagnosis
time only when the end is unknown), and the demo job ends now, so the first `sattrib list`
after `sattrib demo` shows it."""
import sqlite3
from datetime import datetime, timedelta, timezone

from click.testing import CliRunner

from sattrib.analysis import analyze_folder
from sattrib.cli import main
from sattrib.demo import write_demo
from sattrib.store import Store


def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_the_demo_job_is_in_the_first_list(tmp_path):
    assert cli("demo").exit_code == 0
    r = cli("list")
    assert r.exit_code == 0 and "1001" in r.output and "nvlink" in r.output, r.output
    ended = r.output.splitlines()[1][:19]
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    assert abs(datetime.fromisoformat(ended) - now) < timedelta(minutes=5)


def test_list_and_hotspots_count_a_job_on_the_day_it_ended(tmp_path):
    """A job that failed 40 days ago, diagnosed today (a replay, a backlog): in neither the
    last 30 days' list nor its hotspots; in the last 60 days' of both."""
    ended = datetime.now(timezone.utc) - timedelta(days=40)
    d, _ = analyze_folder(write_demo(tmp_path / "old", end=ended))
    db = tmp_path / "diagnoses.db"
    Store(db).upsert(d, "default")
    assert "1001" not in cli("list", "-S", "30d", "--database", str(db)).output
    assert "node-02" not in cli("hotspots", "-S", "30d", "--database", str(db)).output
    assert "1001" in cli("list", "-S", "60d", "--database", str(db)).output
    r = cli("hotspots", "-S", "60d", "--database", str(db))
    assert "LAST ENDED (UTC)" in r.output
    assert f"node-02  1         1     nvlink      {ended:%Y-%m-%d %H:%M:%S}" in r.output


def test_a_run_without_an_end_counts_from_its_diagnosis(tmp_path):
    d, _ = analyze_folder(write_demo(tmp_path / "demo"))
    db = Store(tmp_path / "diagnoses.db")
    did = db.upsert(d.model_copy(update={"job": d.job.model_copy(update={"end": None})}),
                    "default")
    row = sqlite3.connect(tmp_path / "diagnoses.db").execute(
        "SELECT ended_at, created_at FROM diagnoses WHERE id = ?", [did]).fetchone()
    assert row[0] == row[1]

"""Composition: read an evidence folder with the collectors, run the pipeline on it."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

from . import __version__
from .errors import UserError


def load_rules(extra_dirs=()):
    """Built-in and site rules; a site file that does not load is skipped and listed in the
    rule set's problems (every diagnosis made with it says so), never stops the analysis."""
    from .engine.rules import RuleError, load_rules as _load
    try:
        return _load([Path(d) for d in extra_dirs], lenient_site=True)
    except RuleError as e:
        raise UserError(f"invalid rule: {e}", "run `sattrib rules test DIR` to check site rules")


def analysis_settings(st):
    """The pipeline's settings from the site configuration."""
    from .engine.pipeline import Settings
    return Settings(window_before=st.window_before_s, window_after=st.window_after_s,
                    clock_skew=st.clock_skew_s)


def reader_limits(st):
    """The evidence reader's limits from the site configuration."""
    from .collectors.reader import Limits
    return Limits(file_cap=st.file_cap_mb << 20, max_hits=st.max_hits_per_file)


def check_shape(path: Path) -> None:
    """Refuse, with a hint, what is not one job's evidence folder: an empty folder (there is
    nothing to say about a job with no evidence) or a folder of evidence folders (one job
    folder would be taken for a node)."""
    import os
    try:
        top = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}", "check the folder's permissions")
    dirs = [e for e in top if e.is_dir(follow_symlinks=False) and not e.name.startswith((".", "_"))]
    names = {e.name for e in dirs}

    def has_files(d) -> bool:
        try:
            return any(f.is_file(follow_symlinks=False) or f.is_dir(follow_symlinks=False)
                       for f in os.scandir(d.path))
        except OSError:
            return True                       # unreadable: the reader will say so
    if not any(e.is_file(follow_symlinks=False) for e in top) and not any(map(has_files, dirs)):
        raise UserError(f"{path} holds no evidence files",
                        "give the job's evidence folder: slurm/, logs/ and one folder per node "
                        "(see README)")
    if "slurm" in names or "logs" in names:
        return
    jobs = [e.name for e in dirs if any(os.path.isdir(os.path.join(e.path, n)) and
                                        not os.path.islink(os.path.join(e.path, n))
                                        for n in ("slurm", "logs"))]
    if len(jobs) >= 2:
        more = f", ... ({len(jobs)} of them)" if len(jobs) > 3 else ""
        raise UserError(f"{path} looks like a folder of evidence folders "
                        f"({', '.join(jobs[:3])}{more}), not one job's",
                        f"analyze one of them: sattrib analyze {path / jobs[0]}")


def analyze_folder(path: Path, settings=None, rules=None, limits=None, owner: Optional[int] = None,
                   timezone: str = "UTC", reference: bool = False, progress=None):
    """Evidence folder -> (Diagnosis, Bundle). `reference` (for tests): the plain path, with no
    literal prefilter, in one process, every rule on every line; same answer, much slower.
    `progress(files read, files, bytes read, bytes)` is called as the files are read."""
    from .collectors.evidence_folder import FolderReader
    from .engine.pipeline import Settings, diagnose

    path = Path(path)
    if not path.exists():
        raise UserError(f"no such folder: {path}", "give the evidence folder: slurm/, logs/ and one folder per node (see README)")
    if not path.is_dir() or path.is_symlink():
        raise UserError(f"not a folder: {path}", "give the evidence folder, not a file")
    rules = rules or load_rules()
    settings = settings or Settings()
    offset = 0
    if timezone.upper() not in ("UTC", "Z", ""):
        from .config import utc_offset
        utc_offset(timezone, 0)             # validates the name early, with a clear error
        offset = lambda at: utc_offset(timezone, at)  # noqa: E731
    reader = FolderReader(rules, limits=limits, utc_offset=offset, owner=owner,
                          reference=reference)
    reader.progress = progress
    bundle = reader.read(path)
    settings.utc_offset = reader.offset
    d = diagnose(bundle, rules, settings, engine_version=__version__)
    add_user_frames(d, path, owner)
    return d, bundle


# Where the engineer's own code is worth pointing at: the program failed, not the machine.
FRAME_CATEGORIES = {"application_error", "cuda_oom", "host_oom"}


def add_user_frames(d, path: Path, owner: Optional[int] = None) -> None:
    """Each application-error / OOM cause gets the innermost frames of the user's own code from
    the traceback printed above its first job-output evidence line."""
    from .collectors.output_lines import user_frames
    from .engine.models import Frame
    ev = {e.id: e for e in d.evidence}
    for c in ([d.root_cause] if d.root_cause else []) + list(d.candidates):
        if c.category.value not in FRAME_CATEGORIES:
            continue
        for eid in c.evidence:
            e = ev.get(eid)
            if e is None or e.trust.value != "job_output":
                continue
            frames = user_frames(path, e.path, e.line, e.offset, owner)
            if frames:
                c.user_frames = [Frame(**f) for f in frames]
                break


def reading_summary(bundle) -> str:
    """What the reader read, in one line: files and bytes by kind, and how many of them held a
    line the rules know ("recognised")."""
    from .collectors.sources import label
    kinds = Counter(label(doc.kind) for doc in bundle.documents)
    size = sum(doc.size for doc in bundle.documents)
    known = len({ln.doc for ln in bundle.lines} & {doc.path for doc in bundle.documents})
    n = len(bundle.documents)
    parts = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"Read {n} file{'' if n == 1 else 's'} ({_size(size)}{': ' + parts if parts else ''}); "
            f"{known} with lines the rules recognise")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000

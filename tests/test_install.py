"""install.sh: a --prefix install into a temporary tree, its wrappers, idempotence, --dry-run,
--uninstall and --purge.

One real install (venv + `pip install -e`, ~25 s on the 2-core dev VM) is made once for the
module; the uninstall test, last in the file, takes it down. Everything else is --dry-run or
runs the installed wrappers, each well under a second.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "install.sh"
HOOK_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IS_ROOT = os.geteuid() == 0
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


# Explicit, so that the tests never depend on this machine's scontrol / slurm.conf.
SLURM_USER = "slurm" if _user_exists("slurm") else "root"

slow = pytest.mark.slow      # needs the module's real install (~25 s, once)


def clean_env(**extra: str) -> dict:
    """The caller's environment without SATTRIB_* (conftest points those at tmp files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATTRIB_")}
    env.update(extra)
    return env


def run_install(*args, env=None, check=True, src: Path = ROOT):
    r = subprocess.run(["sh", str(src / "install.sh"), *map(str, args)], capture_output=True,
                       text=True, env=env or clean_env(), timeout=300)
    if check:
        assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def action_lines(out: str) -> list[str]:
    """The one-line-per-action part of the output (status in the first 14 columns)."""
    statuses = ("created", "installed", "updated", "fixed", "removed", "exists, kept",
                "would ", "kept", "absent", "WARNING")
    return [ln for ln in out.splitlines() if ln.startswith(statuses)]


def listing(root: Path) -> dict:
    """Every path under root with its type, mode, owner and mtime: any change shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns,
                                             st.st_size)
    return out


class Layout:
    def __init__(self, prefix: Path, output: str = ""):
        self.prefix = prefix
        self.output = output
        self.venv = prefix / "venv"
        self.etc = prefix / "etc"
        self.config = self.etc / "sattrib.toml"
        self.var = prefix / "var/lib/sattrib"
        self.spool = prefix / "var/spool/sattrib"
        self.log = prefix / "var/log/sattrib"
        self.epilog = prefix / "libexec/sattrib-epilog"
        self.epilog_ctld = prefix / "libexec/sattrib-epilog-slurmctld"
        self.sattrib = prefix / "bin/sattrib"

    def args(self, *more) -> list:
        return ["--prefix", self.prefix, "--editable", "--slurm-user", SLURM_USER, *more]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Layout:
    """One real install for the whole module; the uninstall test, last in the file, takes it
    down (if the order is shuffled, `main` below installs again)."""
    lay = Layout(tmp_path_factory.mktemp("install") / "p")
    lay.output = run_install(*lay.args()).stdout
    return lay


@pytest.fixture
def main(installed) -> Layout:
    if not (installed.venv / "bin/sattrib").exists():      # only after a reordered uninstall
        run_install(*installed.args())
    return installed


# ---- options and dry runs (no install needed) --------------------------------------------------

def test_help_and_usage_errors():
    r = run_install("--help")
    assert "--prefix DIR" in r.stdout and "--dry-run" in r.stdout and "--purge" in r.stdout
    assert run_install("--bogus", check=False).returncode == 2
    assert run_install("--purge", check=False).returncode == 2          # only with --uninstall
    assert run_install("--epilog-timeout", "0", check=False).returncode == 2
    assert run_install("--prefix", check=False).returncode == 2


def test_dry_run_on_fresh_prefix_creates_nothing(tmp_path):
    (tmp_path / "keep").write_text("x")
    before = listing(tmp_path)
    prefix = tmp_path / "p"
    r = run_install("--dry-run", *Layout(prefix).args())
    assert listing(tmp_path) == before
    assert not prefix.exists()
    lines = action_lines(r.stdout)
    assert lines and all(ln.startswith("would ") for ln in lines), r.stdout
    for what in ("venv", "etc/sattrib.toml", "etc/rules.d", "var/lib/sattrib/bundles",
                 "var/spool/sattrib", "var/log/sattrib", "libexec/sattrib-epilog",
                 "libexec/sattrib-epilog-slurmctld", "bin/sattrib"):
        assert any(f"{prefix}/{what}" in ln for ln in lines), (what, r.stdout)
    assert "would install  sattrib" in r.stdout and "pip install -e" in r.stdout
    assert "nothing was changed" in r.stdout
    assert f"Epilog={prefix}/libexec/sattrib-epilog" in r.stdout
    assert f"EpilogSlurmctld={prefix}/libexec/sattrib-epilog-slurmctld" in r.stdout


def test_default_paths_follow_a_non_default_prefix(tmp_path):
    r = run_install("--dry-run", "--prefix", tmp_path / "p", "--slurm-user", SLURM_USER)
    assert f"config {tmp_path}/p/etc," in r.stdout
    assert f"database {tmp_path}/p/var/lib/sattrib," in r.stdout
    assert f"spool {tmp_path}/p/var/spool/sattrib," in r.stdout
    assert f"logs {tmp_path}/p/var/log/sattrib" in r.stdout
    r = run_install("--dry-run", "--prefix", tmp_path / "p", "--etc", tmp_path / "conf",
                    "--slurm-user", SLURM_USER)
    assert f"would create   {tmp_path}/conf/sattrib.toml" in r.stdout


def _fake_bin(tmp_path: Path, script: str) -> Path:
    b = tmp_path / "fakebin"
    b.mkdir(exist_ok=True)
    f = b / "scontrol"
    f.write_text("#!/bin/sh\n" + script)
    f.chmod(0o755)
    return b


@pytest.mark.skipif(not _user_exists("daemon"), reason="needs the 'daemon' user")
def test_slurm_user_from_scontrol_then_slurm_conf(tmp_path):
    fake = _fake_bin(tmp_path, 'echo "SlurmUser               = daemon(1)"\n')
    env = clean_env(PATH=f"{fake}:{os.environ['PATH']}")
    r = run_install("--dry-run", "--prefix", tmp_path / "p", env=env)
    assert "Slurm user daemon (group" in r.stdout and "from scontrol show config" in r.stdout

    fake = _fake_bin(tmp_path, "exit 1\n")                       # controller unreachable
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmdUser=root\nslurmuser=daemon # comment\n")
    env = clean_env(PATH=f"{fake}:{os.environ['PATH']}", SLURM_CONF=str(conf))
    r = run_install("--dry-run", "--prefix", tmp_path / "p", env=env)
    assert "Slurm user daemon (group" in r.stdout and f"from {conf})" in r.stdout


def test_missing_slurm_user_falls_back_to_root(tmp_path):
    r = run_install("--dry-run", "--prefix", tmp_path / "p", "--slurm-user", "no-such-user-x")
    assert "WARNING" in r.stdout and "no-such-user-x" in r.stdout
    assert "Slurm user root (group" in r.stdout
    assert not (tmp_path / "p").exists()


def test_python_checks_name_the_debian_package(tmp_path):
    fake = tmp_path / "python-no-venv"
    fake.write_text('#!/bin/sh\ncase "$2" in *ensurepip*) exit 1 ;; esac\nexit 0\n')
    fake.chmod(0o755)
    r = run_install("--dry-run", "--prefix", tmp_path / "p", "--python", fake, check=False)
    assert r.returncode == 1 and "apt install python3-venv" in r.stderr
    old = tmp_path / "python-old"
    old.write_text('#!/bin/sh\ncase "$2" in *version_info*) exit 1 ;; esac\necho 3.9.2\n')
    old.chmod(0o755)
    r = run_install("--dry-run", "--prefix", tmp_path / "p", "--python", old, check=False)
    assert r.returncode == 1 and "needs Python >= 3.11" in r.stderr
    assert not (tmp_path / "p").exists()


def test_paths_the_wrappers_could_not_quote_are_refused(tmp_path):
    for bad in (f"{tmp_path}/a'b", f"{tmp_path}/a$b", f"{tmp_path}/a\"b"):
        r = run_install("--dry-run", "--prefix", bad, check=False)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
    r = run_install("--dry-run", "--prefix", "/", check=False)
    assert r.returncode == 2


# ---- the real install --------------------------------------------------------------------------

@slow
def test_first_install_creates_everything(main):
    out = main.output
    assert out, "the module's install ran before this test"
    for p in (main.prefix, main.venv, main.config, main.etc / "rules.d", main.var,
              main.var / "bundles", main.spool, main.log, main.epilog, main.epilog_ctld,
              main.sattrib, main.log / "epilog.log", main.log / "epilog-slurmctld.log",
              main.log / "worker.log"):
        assert p.exists(), p
        assert any(ln.startswith("created") and str(p) in ln for ln in action_lines(out)), p
    assert (main.venv / "bin/python").is_file() and (main.venv / "pyvenv.cfg").is_file()
    assert f"installed      sattrib {VERSION} into {main.venv}" in out
    assert os.readlink(main.sattrib) == str(main.venv / "bin/sattrib")
    assert "sattrib rules test" in (main.etc / "rules.d/README").read_text()
    assert "Done:" in out and "sattrib config" in out


@slow
@pytest.mark.skipif(not IS_ROOT, reason="ownership is only set as root")
def test_ownership_as_root(main):
    group = grp.getgrgid(pwd.getpwnam(SLURM_USER).pw_gid).gr_name

    def owner(p):
        st = p.stat()
        return (pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name,
                stat.S_IMODE(st.st_mode))
    assert owner(main.var) == (SLURM_USER, group, 0o751)
    assert owner(main.var / "bundles") == (SLURM_USER, group, 0o751)
    assert owner(main.spool) == ("root", group, 0o2770)
    # Root's hooks write into the log directory: only root may add, replace or link a name in
    # it; each log is made for the user that appends to it.
    assert owner(main.log) == ("root", "root", 0o755)
    assert owner(main.log / "epilog.log") == ("root", "root", 0o640)
    assert owner(main.log / "epilog-slurmctld.log") == (SLURM_USER, group, 0o640)
    assert owner(main.log / "worker.log") == (SLURM_USER, group, 0o640)
    assert f"Logs: {main.log} is root:root 0755" in main.output
    assert f"readable by {SLURM_USER}\nand group {group} only" in main.output
    # The worker's files are private whatever slurmctld's umask was.
    assert "\numask 027\n" in main.epilog_ctld.read_text()


@slow
def test_wrappers_are_self_contained(main):
    for w, module, deadline in ((main.epilog, "sattrib.slurm_hooks.epilog", 60),
                                (main.epilog_ctld, "sattrib.slurm_hooks.epilog_slurmctld", 30)):
        text = w.read_text()
        assert os.access(w, os.X_OK) and stat.S_IMODE(w.stat().st_mode) == 0o755
        assert text.startswith("#!/bin/sh\n")
        assert HOOK_PATH in text.splitlines()
        assert f"SATTRIB_CONFIG='{main.config}'" in text
        assert "export PATH SATTRIB_CONFIG" in text
        assert (f"timeout -s KILL {deadline} '{main.venv}/bin/python' -I -m "
                f"sattrib.slurm_hooks.launch \"$log\" \\\n    {module} </dev/null") in text
        # no shell redirection into the log (it would follow a symbolic link)
        assert ">>" not in text and 'dd of="$log" oflag=append,nofollow' in text
        assert text.rstrip().endswith("exit 0")
        assert "set -e" not in text
        assert subprocess.run(["sh", "-n", str(w)]).returncode == 0
    assert f"'{main.log}/epilog.log'" in main.epilog.read_text()
    assert f"'{main.log}/epilog-slurmctld.log'" in main.epilog_ctld.read_text()


@slow
def test_config_has_this_installs_paths(main):
    text = main.config.read_text()
    data = tomllib.loads(text)
    assert data["database"] == f"{main.var}/diagnoses.db"
    assert data["bundle_dir"] == f"{main.var}/bundles"
    assert data["spool_dir"] == str(main.spool)
    assert data["rules_dirs"] == [f"{main.etc}/rules.d"]
    assert data["incident_site_file"] == f"{main.etc}/site.toml"
    reference = (ROOT / "etc/sattrib.toml").read_text()
    documented = set(re.findall(r"^# (\w+) = ", reference, re.M))
    if "log_dir" in documented:
        assert data["log_dir"] == str(main.log)
    assert set(data) <= {"database", "bundle_dir", "spool_dir", "rules_dirs", "log_dir",
                         "incident_site_file"}
    # the rest of the reference is kept, commented
    assert documented - set(data) <= set(re.findall(r"^# (\w+) = ", text, re.M))


@slow
def test_second_run_is_idempotent(main):
    before = listing(main.prefix)
    r = run_install(*main.args())
    assert listing(main.prefix) == before
    lines = action_lines(r.stdout)
    assert lines and all(ln.startswith("exists, kept") for ln in lines), r.stdout
    assert "Nothing to do" in r.stdout and "nothing was changed" in r.stdout
    r = run_install("--dry-run", *main.args())
    assert "Dry run: 0 actions" in r.stdout
    assert listing(main.prefix) == before


@slow
def test_edited_config_is_never_overwritten(main):
    original = main.config.read_text()
    try:
        edited = original + 'cluster = "edited by the admin"\n'
        main.config.write_text(edited)
        r = run_install(*main.args())
        assert main.config.read_text() == edited
        assert f"exists, kept   {main.config}" in r.stdout
    finally:
        main.config.write_text(original)


@slow
def test_changed_deadline_updates_the_wrapper_in_dry_run_only(main):
    before = main.epilog.read_text()
    r = run_install("--dry-run", *main.args("--epilog-timeout", "5"))
    assert f"would update   {main.epilog}" in r.stdout
    assert "Dry run: 1 actions" in r.stdout
    assert main.epilog.read_text() == before


@slow
def test_installed_command_and_config(main):
    r = subprocess.run([str(main.sattrib), "--version"], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    assert r.returncode == 0 and VERSION in r.stdout
    cfg = re.search(r"^SATTRIB_CONFIG='([^']+)'$", main.epilog.read_text(), re.M).group(1)
    r = subprocess.run([str(main.sattrib), "config"], capture_output=True, text=True,
                       env=clean_env(SATTRIB_CONFIG=cfg), timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"database = '{main.var}/diagnoses.db'    # {cfg}" in r.stdout
    assert f"spool_dir = '{main.spool}'    # {cfg}" in r.stdout


def test_installed_dashboard_registers_every_part(main, tmp_path):
    """The installed `sattrib serve` finds the dashboard's plugin and each of its parts (one
    module per part, registered as Datasette registers its own) and serves its pages."""
    py = main.venv / "bin/python"
    db = tmp_path / "diagnoses.db"
    subprocess.run([str(py), "-c", f"from sattrib.store import Store; Store({str(db)!r})"],
                   check=True, env=clean_env(), timeout=60)
    cfg = re.search(r"^SATTRIB_CONFIG='([^']+)'$", main.epilog.read_text(), re.M).group(1)
    r = subprocess.run([str(main.sattrib), "serve", "--print-command", "--database", str(db)],
                       capture_output=True, text=True, env=clean_env(SATTRIB_CONFIG=cfg),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    argv = argv[: argv.index("--host")] + argv[argv.index("--setting"):]
    assert argv[0].startswith(str(main.venv))

    def get(path):
        r = subprocess.run([*argv, "--get", path], capture_output=True, text=True,
                           env=clean_env(), timeout=120, cwd=tmp_path)
        assert r.returncode == 0, (path, r.stderr[-800:])
        return r.stdout
    names = {p["name"] for p in json.loads(get("/-/plugins.json"))}
    assert {f"sattrib_dashboard.{part}" for part in (
        "database", "guards", "cells", "shown", "summary", "home", "job", "diagnosis", "node",
        "gpu")} \
        <= names
    assert "No diagnoses yet" in get("/")
    assert json.loads(get("/diagnoses/node_hotspots.json?_shape=array")) == []


# ---- the wrappers at work (run as Slurm does: no environment at all) ----------------------------

def _run_hook(path: Path, env: dict, timeout: float = 60):
    t0 = time.monotonic()
    r = subprocess.run([str(path)], env=env, capture_output=True, text=True, timeout=timeout,
                       cwd="/")
    return r, time.monotonic() - t0


@slow
@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "41", "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0",
     "SLURM_JOB_DERIVED_EC": "0"},
    {"SLURM_JOB_ID": "42", "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0",
     "SLURM_JOB_DERIVED_EC": "0:0"},
    {"SLURM_JOB_ID": "43"},
    {"SLURM_JOB_ID": "44", "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0",
     "SLURM_JOB_DERIVED_EC": "15"},
], ids=["derived-0", "derived-0:0", "unset", "stale-derived"])
def test_epilog_fast_path_starts_no_python(main, env):
    log = main.log / "epilog.log"
    size = log.stat().st_size if log.exists() else -1
    best = min(_run_hook(main.epilog, env)[1] for _ in range(3))   # robust to a busy machine
    r, _ = _run_hook(main.epilog, env)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert best < 0.2, best
    assert (log.stat().st_size if log.exists() else -1) == size    # nothing was logged


def _hook_copy(main: Layout, tmp_path: Path, **replace: str) -> Path:
    text = main.epilog.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / "epilog"
    p.write_text(text)
    p.chmod(0o755)
    return p


FAILED_JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_EXIT_CODE2": "1:0",
              "SLURM_JOB_DERIVED_EC": "1", "SLURMD_NODENAME": "node-07"}


@slow
def test_epilog_exits_0_when_the_hook_module_fails(main, tmp_path):
    hook = _hook_copy(main, tmp_path, **{
        "sattrib.slurm_hooks.epilog ": "sattrib.slurm_hooks.no_such_module ",
        f"'{main.log}/epilog.log'": f"'{tmp_path}/epilog.log'"})
    r, _ = _run_hook(hook, FAILED_JOB)
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "epilog.log").read_text()
    assert "job 4242 on node-07: exit 1:0" in log
    assert ("cannot import the hook module: No module named "
            "'sattrib.slurm_hooks.no_such_module'") in log
    assert "epilog hook exited 1" in log


@slow
def test_epilog_exits_0_at_the_hard_deadline(main, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    hook = _hook_copy(main, tmp_path, **{
        "timeout -s KILL 60 ": "timeout -s KILL 1 ",
        f"'{main.venv}/bin/python'": f"'{fake}'",
        f"'{main.log}/epilog.log'": f"'{tmp_path}/epilog.log'"})
    r, took = _run_hook(hook, FAILED_JOB)
    assert r.returncode == 0 and took < 10, took
    assert "epilog hook exited 137" in (tmp_path / "epilog.log").read_text()


@slow
def test_epilog_exits_0_when_the_log_is_unwritable(main, tmp_path):
    hook = _hook_copy(main, tmp_path, **{
        "sattrib.slurm_hooks.epilog ": "sattrib.slurm_hooks.no_such_module ",
        f"'{main.log}/epilog.log'": "'/nonexistent/dir/epilog.log'"})
    r, _ = _run_hook(hook, FAILED_JOB)
    assert r.returncode == 0 and r.stderr == ""


@slow
def test_real_epilog_of_a_failed_job_exits_0(main):
    """The installed wrapper, unchanged, runs the real hook with the baked-in config."""
    log = main.log / "epilog.log"
    r, _ = _run_hook(main.epilog, FAILED_JOB, timeout=90)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    text = log.read_text()
    assert "job 4242 on node-07: exit 1:0" in text
    assert len(text.splitlines()) >= 2          # Python ran and wrote something as well
    if IS_ROOT:
        # umask 007 in the wrapper: what the hook made in the spool stays group-writable,
        # so that the controller worker (SlurmUser's group) can delete it
        for dirpath, dirnames, _ in os.walk(main.spool):
            for d in dirnames:
                assert Path(dirpath, d).stat().st_mode & 0o070 == 0o070, (dirpath, d)


@slow
@pytest.mark.skipif(not IS_ROOT, reason="the hooks' log layout is set as root")
def test_planted_log_links_are_not_followed_and_a_rerun_replaces_them(main, tmp_path):
    """Before: the log directory was root:<SlurmUser group> 0775 and the Epilog appended with
    `>>`; a symlink planted as SlurmUser made root append to a root-only file. The directory of
    an older install is fixed by a rerun, and what was planted in it is replaced, not followed."""
    group = grp.getgrgid(pwd.getpwnam(SLURM_USER).pw_gid).gr_name
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    target = secret / "shadow"
    target.write_text("root only\n")
    target.chmod(0o600)
    log = main.log / "epilog.log"
    log.unlink()
    log.symlink_to(target)
    r, _ = _run_hook(main.epilog, FAILED_JOB, timeout=90)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert target.read_text() == "root only\n"
    assert log.is_symlink()

    # the layout of an older install, with its log directory group-writable
    os.chown(main.log, 0, grp.getgrnam(group).gr_gid)
    main.log.chmod(0o775)
    (main.log / "worker.log").unlink()
    os.link(target, main.log / "worker.log")                   # a hard link as well
    r = run_install(*main.args())
    assert f"fixed          {main.log}  (hook logs; was root:{group} 775, now root:root 0755)" \
        in r.stdout
    assert f"fixed          {log}  (node Epilog log (root); was a symbolic link" in r.stdout
    assert f"worker.log  (controller worker log ({SLURM_USER}); was a file with 2 hard links" \
        in r.stdout
    for name, who in (("epilog.log", "root"), ("worker.log", SLURM_USER)):
        st = (main.log / name).lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0, name
        assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == (who, 0o640)
    assert target.read_text() == "root only\n" and target.stat().st_nlink == 1
    assert "Nothing to do" in run_install(*main.args()).stdout


@slow
def test_dependencies_are_the_pinned_ones(main):
    lock = (ROOT / "etc/requirements.lock").read_text()
    pins = {}
    for m in re.finditer(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)(?: ; ([^\\]+))?", lock, re.M):
        name, version, marker = m.groups()
        if marker and "x86_64" in marker and os.uname().machine != "x86_64":
            continue
        pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    assert "hyperscan" in pins and "setuptools" in pins and "pydantic" in pins
    assert "pytest" not in pins                     # the test extras are not in the lock
    r = subprocess.run([str(main.venv / "bin/pip"), "freeze", "--all", "--exclude-editable"],
                       capture_output=True, text=True, env=clean_env(), timeout=120)
    have = {}
    for line in r.stdout.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            have[re.sub(r"[-_.]+", "-", name.lower())] = version
    for name, version in pins.items():
        assert have.get(name) == version, (name, version, have.get(name))
    assert set(have) <= set(pins), set(have) - set(pins)
    assert "hashes checked" in main.output


@slow
def test_a_dependency_whose_hash_differs_is_not_installed(tmp_path):
    """install.sh installs only what etc/requirements.lock pins, by hash: a lock whose hash of
    PyYAML does not match the real file stops the install before sattrib is installed."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "tests", "bench", "__pycache__", "*.egg-info", "docs"))
    lock = src / "etc/requirements.lock"
    text = lock.read_text()
    block = re.search(r"^pyyaml==.*?(?=^\S)", text, re.M | re.S).group(0)
    forged = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, block)
    lock.write_text(text.replace(block, forged))
    lay = Layout(tmp_path / "p")
    r = run_install(*lay.args(), src=src, check=False)
    assert r.returncode == 1, r.stdout
    assert "error: pip install --require-hashes -r" in r.stderr
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in r.stdout + r.stderr
    assert not (lay.venv / "bin/sattrib").exists()
    assert not lay.epilog.exists()                  # nothing after pip was done


@pytest.mark.skipif(not IS_ROOT or not Path("/etc/logrotate.d").is_dir(),
                    reason="the logrotate file is written by a root install with the default prefix")
def test_default_install_rotates_the_logs_for_their_writers():
    r = run_install("--dry-run", "--slurm-user", SLURM_USER)
    assert "would create   /etc/logrotate.d/sattrib  (logrotate: re-creates each log" in r.stdout \
        or "exists, kept   /etc/logrotate.d/sattrib" in r.stdout, r.stdout


@slow
def test_epilog_slurmctld_wrapper_exits_0_at_once(main):
    log = main.log / "epilog-slurmctld.log"
    seen = log.stat().st_size
    r, took = _run_hook(main.epilog_ctld, {})                     # no SLURM_JOB_ID: no work
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert took < 10
    # The hook says why it queued nothing (and starts no worker for an empty queue).
    assert b"no SLURM_JOB_ID" in log.read_bytes()[seen:]


# ---- uninstall ---------------------------------------------------------------------------------

@slow
def test_uninstall_dry_run_changes_nothing(main):
    before = listing(main.prefix)
    r = run_install("--uninstall", "--dry-run", "--prefix", main.prefix)
    assert f"would remove   {main.venv}" in r.stdout
    assert f"would remove   {main.epilog}" in r.stdout
    assert listing(main.prefix) == before


def test_purge_empties_only_our_files_from_a_foreign_directory(tmp_path):
    """A directory that is not sattrib's own (here --log) loses only sattrib's files."""
    lay = Layout(tmp_path / "p")
    lay.config.parent.mkdir(parents=True)
    lay.config.write_text("# config\n")
    lay.var.mkdir(parents=True)
    (lay.var / "diagnoses.db").write_text("db")
    shared = tmp_path / "shared-logs"
    shared.mkdir()
    (shared / "epilog.log").write_text("ours\n")
    (shared / "other.log").write_text("not ours\n")
    r = run_install("--uninstall", "--purge", "--prefix", lay.prefix, "--log", shared)
    assert not lay.prefix.exists(), r.stdout
    assert not (shared / "epilog.log").exists()
    assert (shared / "other.log").read_text() == "not ours\n"
    assert f"WARNING        {shared} is not sattrib's own directory" in r.stdout


@slow
def test_uninstall_keeps_data_then_purge_removes_everything(main):
    """Last in the file: it takes the module's install down."""
    (main.var / "diagnoses.db").write_text("pretend database")
    (main.log / "epilog.log").write_text("a line\n")
    r = run_install("--uninstall", "--prefix", main.prefix)
    for gone in (main.venv, main.epilog, main.epilog_ctld, main.sattrib,
                 main.prefix / "libexec", main.prefix / "bin"):
        assert not os.path.lexists(gone), gone
        assert f"removed        {gone}" in r.stdout
    for kept in (main.config, main.etc / "rules.d", main.var / "diagnoses.db",
                 main.var / "bundles", main.spool, main.log / "epilog.log"):
        assert kept.exists(), kept
    r = run_install("--uninstall", "--prefix", main.prefix)
    assert "Nothing to do" in r.stdout

    r = run_install("--uninstall", "--purge", "--prefix", main.prefix)
    assert not main.prefix.exists(), r.stdout

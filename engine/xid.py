"""The Xid catalog as data (xid_catalog.tsv) and what it says about one Xid line.

`classify(code, body)` returns the category, role and action NVIDIA's catalog implies for an
Xid. Where the catalog's columns alone do not say it, a row of xid_policy.tsv does, and names
the decode that reads the line's own fields (Xid 74's registers, the NVLink5 decode table of
Xid 144-150, the recovery action Xid 154 carries, the earlier Xid an Xid 45 names). Pure: the
tables are read once from the package.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from .taxonomy import Action, Category, Role, Tag

CATALOG_PATH = Path(__file__).parent / "xid_catalog.tsv"
POLICY_PATH = Path(__file__).parent / "xid_policy.tsv"


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    component: str
    hw: str                 # yes | maybe | no
    immediate: str
    investigatory: str
    current: bool           # applies to A100/H100/B100/GB200 (False: legacy code)
    meaning: str


@dataclass(frozen=True)
class Nvl5Row:
    xid: int
    units: tuple[str, ...]
    low_v1: str
    low_v2: str
    reason: Optional[int]
    error_status: str
    immediate: str
    investigatory: str
    severity: str
    hw_sw: str


@dataclass(frozen=True)
class Policy:
    """A row of xid_policy.tsv: how one line of the code is read, where its catalog row's
    columns alone do not say it."""
    category: Category
    role: Role
    action: Action
    weak: bool
    tag: Optional[Tag]
    decode: Optional[str]


@dataclass
class XidVerdict:
    code: int                        # the Xid the line reports (an Xid 45 names an earlier one)
    category: Category
    role: Role
    weak: bool = False               # hardware only "maybe": ranks with program-level causes
    suggests: bool = False           # alone it points at its cause, needs a second line to prove it
    tags: set[str] = field(default_factory=set)
    action: Action = Action.none
    detail: str = ""                 # catalog wording for the summary / action text
    recovery: Optional[int] = None   # Xid 154 recovery action value


@lru_cache(maxsize=1)
def _catalog_text() -> str:
    return CATALOG_PATH.read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _policy_text() -> str:
    return POLICY_PATH.read_text(encoding="utf-8")


def catalog_digest() -> str:
    """The tables' digest, part of the rules version; reading the policy checks it."""
    policy()
    return hashlib.sha256(_catalog_text().encode() + b"\0" + _policy_text().encode()).hexdigest()


@lru_cache(maxsize=1)
def catalog() -> tuple[dict[int, XidInfo], tuple[Nvl5Row, ...]]:
    infos: dict[int, XidInfo] = {}
    rows: list[Nvl5Row] = []
    for raw in _catalog_text().splitlines():
        if raw.startswith("#\tNVL5_DECODE\t"):
            f = raw.split("\t")[2:]
            rows.append(Nvl5Row(int(f[0]), tuple(f[1].split("/")), f[2], f[3],
                                None if f[4] == "-" else int(f[4]), f[5], f[6], f[7], f[8], f[9]))
            continue
        if raw.startswith("#") or raw.startswith("xid\t") or not raw.strip():
            continue
        f = raw.split("\t")
        infos[int(f[0])] = XidInfo(int(f[0]), f[1], f[2], f[3], f[4], f[5], "=Y" in f[6], f[7])
    return infos, tuple(rows)


BUCKET_TEXT = {
    "INVESTIGATE_LINK_SI": "inspect NVLink signal integrity",
    "INVESTIGATE_LINK_SI_AND_CABLES": "inspect NVLink signal integrity, cables and transceivers",
    "INVESTIGATE_PEER_DEVICE": "inspect the far end of the NVLink (peer GPU / switch)",
    "INVESTIGATE_SW_USER": "check whether the link was taken down on purpose (software/user)",
    "INVESTIGATE_SW_USER_LINK_SI": "check software/user action, then NVLink signal integrity",
    "INVESTIGATE_HOST": "check the host's other logs (secondary indicator)",
    "REPORT_ISSUE (if seen >1 per day)": "report to NVIDIA if it recurs more than once a day",
    "CONTACT_SUPPORT": "contact NVIDIA support",
}

RECOVERY = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P",
            4: "Drain and Reset", 5: "GPU Reset (bus)"}
RECOVERY_ACTION = {1: Action.reset_gpu, 2: Action.reboot_node, 3: Action.drain_node,
                   4: Action.drain_node, 5: Action.reset_gpu}

_HEX = re.compile(r"0x[0-9a-fA-F]+")
_X74 = re.compile(r"NVLink: fatal error detected on link (\d+)\(([^)]*)\)")
_NVL5 = re.compile(r"^(?P<unit>[A-Z0-9_]+(?:/[A-Z0-9_]+)?)\s+(?P<sev>Nonfatal|Fatal)\s+(?P<xc>XC\s?[01])"
                   r"\s+(?P<inj>i\s?\d+)\s+Link\s+(?P<link>-?\d+)\s+\((?P<regs>[^)]*)\)")
_CAUSED_BY = re.compile(r"\bcaused by previous Xid (\d+)")
_X154 = re.compile(r"recovery action changed from (0x[0-9a-fA-F]+)[^)]*\)? to (0x[0-9a-fA-F]+)")

# Hardware buckets: the catalog says the device needs a reset / reboot / vendor.
_HW_IMMEDIATE = {"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                 "CHECK_MECHANICALS", "CONTACT_SUPPORT"}


def _bits(v: int) -> set[int]:
    return {i for i in range(32) if v >> i & 1}


def _decode_74(info: XidInfo, body: str, v: XidVerdict) -> XidVerdict:
    m = _X74.search(body)
    if not m:
        return v
    regs = [int(x, 16) for x in _HEX.findall(m.group(2))] + [0] * 7
    r1, r3, r4, r5 = _bits(regs[0]), _bits(regs[2]), _bits(regs[3]), _bits(regs[4])
    v.tags.add(f"link{m.group(1)}")
    if r1 and r1 <= {0, 23, 30} and not (r3 or r4 or r5):
        v.role, v.detail = Role.context, "R1 bits the catalog says to ignore"
    elif r1 <= {1, 20} and r4 <= {16, 17, 18} and not (r3 or r5) and (r1 or r4):
        v.role, v.detail = Role.symptom, "register bits the catalog calls usually sympathetic"
        v.tags.add(Tag.sympathetic)
    elif r1 & {4, 5} or r3 & {0, 1, 2, 6} or r5 & {18, 19, 21, 22, 24, 25, 27, 28}:
        v.detail = "ECC/parity error on the link (hardware)"
    elif r1 & {8, 9, 12, 16, 17, 24, 28}:
        v.detail = "possible hardware fault on the link: reseat/check, run diagnostics"
    elif r1 & {21, 22}:
        v.detail = "marginal channel signal integrity"
    return v


def _decode_nvl5(info: XidInfo, body: str, v: XidVerdict) -> XidVerdict:
    m = _NVL5.search(body)
    if not m:
        v.weak = info.hw != "yes"       # undecoded: only the catalog's word on the hardware
        return v
    regs = [int(x, 16) for x in _HEX.findall(m.group("regs"))]
    intr = regs[0] if regs else 0
    status = regs[1] if len(regs) > 1 else 0
    unit = m.group("unit")
    sev = m.group("sev")
    units = set(unit.split("/"))
    low10 = format(intr & 0x3FF, "010b")
    low7 = format(intr & 0x7F, "07b")
    reason = (intr >> 20) & 0x3F
    v.tags.add(f"link{int(m.group('link'))}")
    best = None
    rows = [r for r in catalog()[1] if r.xid == info.code]
    named = [r for r in rows if units & set(r.units)]
    rows = named or [r for r in rows if r.low_v1[-10:] == low10 or r.low_v2[-7:] == low7]
    for row in rows:
        if row.error_status not in ("any",) and "/" not in row.error_status:
            if int(row.error_status, 16) != status:
                continue
        if row.reason is not None and row.reason != reason:
            continue
        best = row
        break
    if best is None:
        v.detail = f"{unit} {sev}"
        v.role = Role.root if sev == "Fatal" else Role.context
        v.weak = sev != "Fatal"
        return v
    what = f"{unit} {best.severity}"
    if best.reason is not None:
        what += f", link-down reason {reason}"
    advice = BUCKET_TEXT.get(best.investigatory, best.investigatory.lower().replace("_", " "))
    v.detail = f"{what}: {advice}"
    v.tags.add("nvl5:" + best.investigatory)
    sympathetic = ("SYMPATHETIC" in best.investigatory or "CHECK_NVLINK_FAILURE_FLOW" in
                   best.investigatory or best.immediate == "XID_154_EVAL")
    if sympathetic:
        v.role = Role.symptom
        v.tags.add(Tag.sympathetic)
    elif best.immediate == "IGNORE" and "Fatal" not in best.severity:
        v.role = Role.context
    else:
        v.role = Role.root
        v.action = Action.reset_gpu if best.immediate == "RESET_GPU" else Action.inspect_nvlink
        if "SW" in best.hw_sw and "HW" not in best.hw_sw:
            v.weak = True
    return v


def _decode_154(info: XidInfo, body: str, v: XidVerdict) -> XidVerdict:
    m = _X154.search(body)
    if m:
        v.recovery = int(m.group(2), 16)
        v.action = RECOVERY_ACTION.get(v.recovery, Action.none)
        if v.action == Action.reboot_node:
            v.tags.add(Tag.reboot_required)
        v.detail = f"recovery action now {RECOVERY.get(v.recovery, m.group(2))}"
    return v


def _follows(info: XidInfo, body: str, v: XidVerdict) -> XidVerdict:
    """The driver tore the channel down after an earlier Xid it names: the line is the
    driver's own word that that Xid happened on this GPU, even where its line is gone."""
    m = _CAUSED_BY.search(body)
    if not m:
        return v
    first = int(m.group(1))
    w = classify(first, "")
    w.detail = f"Xid {info.code} after Xid {first} ({meaning(first)})"
    return w


# The decodes a policy row may name: each reads the line's own fields into the verdict.
DECODES = {"nvlink74": _decode_74, "nvlink5": _decode_nvl5, "recovery": _decode_154,
           "follows": _follows}


@lru_cache(maxsize=1)
def policy() -> dict[int, Policy]:
    """xid_policy.tsv, checked: a code the catalog lacks, a value outside its vocabulary or a
    repeated code is refused with its line number."""
    out: dict[int, Policy] = {}
    head = None
    for n, raw in enumerate(_policy_text().splitlines(), 1):
        if raw.startswith("#") or not raw.strip():
            continue
        f = raw.split("\t")
        if head is None:
            head = f
            continue
        try:
            out.update(_policy_row(f, out))
        except (ValueError, KeyError) as e:
            raise ValueError(f"{POLICY_PATH.name}:{n}: {e}") from None
    return out


def _policy_row(f: list[str], seen: dict) -> dict[int, Policy]:
    if len(f) != 8:
        raise ValueError(f"expected 8 tab-separated columns, got {len(f)}")
    code = int(f[0])
    if code not in catalog()[0] or code in seen:
        raise ValueError(f"Xid {code} is {'repeated' if code in seen else 'not in the catalog'}")
    if f[4] not in ("yes", "no"):
        raise ValueError(f"weak is yes or no, not {f[4]!r}")
    if f[6] != "-" and f[6] not in DECODES:
        raise ValueError(f"unknown decode {f[6]!r} (known: {', '.join(sorted(DECODES))})")
    return {code: Policy(Category(f[1]), Role(f[2]), Action(f[3]), f[4] == "yes",
                         None if f[5] == "-" else Tag(f[5]), None if f[6] == "-" else f[6])}


def classify(code: int, body: str) -> XidVerdict:
    infos = catalog()[0]
    info = infos.get(code)
    if info is None:
        return XidVerdict(code, Category.gpu_hardware, Role.context, weak=True,
                          detail=f"Xid {code} is not in the catalog")
    v = XidVerdict(code, Category.gpu_hardware, Role.root, detail=info.meaning)
    comp, hw = info.component, info.hw
    if info.immediate == "RESTART_APP":
        # NVIDIA's immediate action is to restart the application: the GPU stays in service.
        v.tags.add(Tag.restart_app)
    if info.investigatory in ("WORKFLOW_XID_13", "WORKFLOW_XID_31"):
        # NVIDIA's workflow: the same fault repeating on one GPU for unrelated programs is the
        # GPU; spread over GPUs or from one program it is the program.
        v.tags.add(Tag.repeat_implicates_gpu)
    if not info.current:
        v.role, v.weak = Role.context, True
        v.detail = f"legacy Xid {code} ({info.meaning})"
        return v
    row = policy().get(code)
    if row is not None:
        v.category, v.role, v.action, v.weak = row.category, row.role, row.action, row.weak
        if row.tag is not None:
            v.tags.add(row.tag)
        return DECODES[row.decode](info, body, v) if row.decode else v
    if comp == "gpu_memory":
        v.category = Category.gpu_memory_ecc
        if info.immediate == "IGNORE":
            v.role = Role.confirmation
        v.action = Action.reset_gpu
        return v
    if comp == "application":
        # The program's fault only with the job's own error beside it (a rank's exception on
        # the node): alone, the same Xid comes from a faulty GPU's SM as well.
        v.category = Category.application_error
        v.role = Role.symptom if info.immediate == "IGNORE" else Role.root
        v.weak = v.suggests = True
        v.action = Action.fix_application
        return v
    if comp == "nvlink":
        v.category = Category.nvlink
        if hw == "no":
            v.role = Role.context
        return v
    if comp == "pcie_bus":
        v.category, v.weak = Category.pcie, True
        return v
    if comp == "thermal_power":
        v.category = Category.thermal_power
        if hw != "yes":
            v.role = Role.context
        v.action = Action.check_cooling_power
        return v
    if comp == "c2c":
        v.role = Role.context if info.immediate == "IGNORE" else Role.symptom
        return v
    # gpu_engine, driver_firmware, unknown
    if hw == "no" or info.immediate in ("IGNORE", "N/A"):
        v.role = Role.context
    elif info.immediate not in _HW_IMMEDIATE:
        v.weak = True            # e.g. a copy-engine exception: RESTART_APP, maybe hardware
    # NVIDIA's catalog says the hardware "maybe" did it: alone it points at the GPU, and the
    # driver's recovery action (Xid 154), a lost GPU or a second fault on it backs it.
    v.suggests = hw == "maybe"
    v.action = Action.reset_gpu if info.immediate == "RESET_GPU" else Action.contact_support
    return v


def mnemonic(code: int) -> str:
    info = catalog()[0].get(code)
    return info.mnemonic if info else f"XID_{code}"


def meaning(code: int) -> str:
    info = catalog()[0].get(code)
    return info.meaning if info else "not in the catalog"

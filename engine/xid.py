"""The Xid catalog as data (xid_catalog.tsv) and what it says about one Xid line.

`classify(code, body)` returns the category, role and action NVIDIA's catalog implies for an
Xid, including the register decode of Xid 74, the NVLink5 decode table of Xid 144-150 and the
recovery action carried by Xid 154. Pure: the catalog text is read once from the package.
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


@dataclass
class XidVerdict:
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


def catalog_digest() -> str:
    return hashlib.sha256(_catalog_text().encode()).hexdigest()


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
_X154 = re.compile(r"recovery action changed from (0x[0-9a-fA-F]+)[^)]*\)? to (0x[0-9a-fA-F]+)")

# Hardware buckets: the catalog says the device needs a reset / reboot / vendor.
_HW_IMMEDIATE = {"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                 "CHECK_MECHANICALS", "CONTACT_SUPPORT"}


def _bits(v: int) -> set[int]:
    return {i for i in range(32) if v >> i & 1}


def _decode_74(body: str, v: XidVerdict) -> None:
    m = _X74.search(body)
    if not m:
        return
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


def _decode_nvl5(code: int, body: str, v: XidVerdict) -> None:
    m = _NVL5.search(body)
    if not m:
        v.weak = code not in (144, 146)
        return
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
    rows = [r for r in catalog()[1] if r.xid == code]
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
        return
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


def classify(code: int, body: str) -> XidVerdict:
    infos = catalog()[0]
    info = infos.get(code)
    if info is None:
        return XidVerdict(Category.gpu_hardware, Role.context, weak=True,
                          detail=f"Xid {code} is not in the catalog")
    v = XidVerdict(Category.gpu_hardware, Role.root, detail=info.meaning)
    comp, hw = info.component, info.hw
    if info.immediate == "RESTART_APP":
        # NVIDIA's immediate action is to restart the application: the GPU stays in service.
        v.tags.add(Tag.restart_app)
    if info.investigatory in ("WORKFLOW_XID_13", "WORKFLOW_XID_31"):
        # NVIDIA's workflow: the same fault repeating on one GPU for unrelated programs is the
        # GPU; spread over GPUs or from one program it is the program.
        v.tags.add(Tag.repeat_implicates_gpu)
    if code == 154:
        v.category, v.role = Category.gpu_hardware, Role.confirmation
        m = _X154.search(body)
        if m:
            v.recovery = int(m.group(2), 16)
            v.action = RECOVERY_ACTION.get(v.recovery, Action.none)
            if v.action == Action.reboot_node:
                v.tags.add(Tag.reboot_required)
            v.detail = f"recovery action now {RECOVERY.get(v.recovery, m.group(2))}"
        return v
    if code == 45:
        v.category, v.role = Category.application_error, Role.symptom
        v.tags.add(Tag.channel_teardown)
        return v
    if not info.current:
        v.role, v.weak = Role.context, True
        v.detail = f"legacy Xid {code} ({info.meaning})"
        return v
    if comp == "gpu_memory":
        v.category = Category.gpu_memory_ecc
        if info.immediate == "IGNORE" or code in (171, 172):
            v.role = Role.confirmation if code != 92 else Role.context
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
        if code == 74:
            v.action = Action.inspect_nvlink
            _decode_74(body, v)
        elif 144 <= code <= 150:
            _decode_nvl5(code, body, v)
        elif code == 137:
            v.category, v.weak, v.action = Category.application_error, True, Action.fix_application
        elif hw == "no":
            v.role = Role.context
        return v
    if comp == "pcie_bus":
        if code in (79, 167):
            v.tags.add(Tag.device_lost)
            v.action = Action.reboot_node
        else:
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

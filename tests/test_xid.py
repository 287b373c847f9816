"""The Xid catalog as data, and what it says about real Xid lines."""
from pathlib import Path

import pytest

from sattrib.engine import xid
from sattrib.engine.taxonomy import Category, Role

REFERENCE = Path(__file__).parent.parent / "engine" / "xid_catalog.tsv"


def test_catalog_has_every_code():
    rows = [r for r in REFERENCE.read_text().splitlines() if r[:1].isdigit()]
    infos, nvl5 = xid.catalog()
    assert len(infos) == len(rows) >= 170
    assert {144, 145, 146, 147, 148, 149, 150, 154} <= set(infos)
    assert len(nvl5) > 60


@pytest.mark.parametrize("code,body,cat,role", [
    (79, "GPU has fallen off the bus.", Category.gpu_hardware, Role.root),
    (48, "An uncorrectable double bit error (DBE) has been detected", Category.gpu_memory_ecc, Role.root),
    (63, "Row Remapper: New row marked for remapping", Category.gpu_memory_ecc, Role.confirmation),
    (31, "MMU Fault: ENGINE GRAPHICS", Category.application_error, Role.root),
    (43, "Ch 00000020, engmask 00000101", Category.application_error, Role.symptom),
    (45, "Ch 00000008", Category.application_error, Role.symptom),
    (119, "Timeout after 6s of waiting for RPC response from GPU4 GSP!", Category.gpu_hardware, Role.root),
    (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Category.gpu_hardware, Role.confirmation),
    (1, "legacy", Category.gpu_hardware, Role.context),
])
def test_classify(code, body, cat, role):
    v = xid.classify(code, body)
    assert (v.category, v.role) == (cat, role)


def test_154_recovery_action():
    v = xid.classify(154, "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)")
    assert v.recovery == 2 and v.action.value == "reboot_node"


def test_74_register_decode():
    root = xid.classify(74, "NVLink: fatal error detected on link 4(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
    peer = xid.classify(74, "NVLink: fatal error detected on link 2(0x2, 0x0, 0x0, 0x30000, 0x0, 0x0, 0x0)")
    assert root.role == Role.root and "hardware" in root.detail
    assert peer.role == Role.symptom and "sympathetic" in peer.tags


@pytest.mark.parametrize("body,reason,role,bucket", [
    # gpud test fixture from a GB200 tray: reason (0x021425c6 >> 20) & 0x3f = 33
    ("NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     33, Role.root, "INVESTIGATE_PEER_DEVICE"),
    ("NETIR_LINK_EVT  Fatal   XC0 i0 Link 07 (0x00a025c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     10, Role.root, "INVESTIGATE_LINK_SI"),
    ("NETIR_LINK_EVT  Fatal   XC0 i0 Link 07 (0x000025c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     0, Role.symptom, "SYMPATHETIC_REPORT_SOLO"),
])
def test_149_decode(body, reason, role, bucket):
    v = xid.classify(149, body)
    assert v.role == role
    assert f"nvl5:{bucket}" in v.tags
    assert v.category == Category.nvlink


def test_145_sympathetic_and_ber_event():
    v = xid.classify(145, "RLW_REMAP Nonfatal XC1 i0 Link 03 (0x00000082 0x00000004 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert v.role == Role.symptom
    ber = xid.classify(149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert ber.role != Role.root


def test_real_gpud_lines_parse(rules):
    """Every Xid line quoted in gpud's tests is matched and decoded without error."""
    from sattrib.engine.lineparse import clean, split_prefix
    path = Path(__file__).parent / "data" / "samples" / "kernel-lines.gb200-xid149-154-sxid-mlx5.from-gpud-tests.txt"
    rule = rules.by_id["gpu.xid"]
    family = {145: Category.nvlink, 149: Category.nvlink, 94: Category.gpu_memory_ecc,
              95: Category.gpu_memory_ecc, 119: Category.gpu_hardware, 154: Category.gpu_hardware}
    n, roots = 0, set()
    for line in path.read_text().splitlines():
        if line.startswith("#") or "NVRM: Xid" not in line:
            continue
        m = rule.search(split_prefix(clean(line)).message)
        assert m, line
        code = int(m.group("xid"))
        v = xid.classify(code, m.group("body"))
        assert v.category == family[code], line
        if code == 154:      # a recovery action follows a fault, it is not one
            assert v.role == Role.confirmation, line
        if v.role == Role.root:
            roots.add(code)
        n += 1
    assert n >= 10
    # Fatal link events, ECC and GSP timeouts are roots; non-fatal 145/BER events never are.
    assert roots == {149, 94, 95, 119}


def test_xid45_naming_the_xid_before_it_is_that_xid(tmp_path, rules):
    # The driver's channel teardown names the Xid that caused it; its own line may be gone
    # (rotated, cut from a paste): the Xid 45 is the driver's word that it happened.
    from helpers import folder
    from sattrib.analysis import analyze_folder
    lines = "".join(f"kernel: NVRM: Xid (PCI:0000:{bus}:00): 45, pid=18189{i}, name=python3, "
                    f"Ch 0000000{i} caused by previous Xid {x}\n"
                    for i, (bus, x) in enumerate((("dc", 149), ("ed", 145), ("ba", 145))))
    d, _ = analyze_folder(folder(tmp_path, {"node-01/journal.log": lines}), rules=rules)
    assert (d.outcome.value, d.root_cause.category.value, d.root_cause.node) == (
        "attributed", "nvlink", "node-01")
    # Without the name of what caused it, a lone channel teardown is no cause.
    d, _ = analyze_folder(folder(tmp_path / "b", {"node-01/journal.log": (
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=181890, name=python3, Ch 00000001\n")}),
        rules=rules)
    assert d.outcome.value == "unattributed"


def test_xid45_is_a_symptom_beside_another_xid_and_context_alone(tmp_path, rules):
    """A channel teardown (Xid 45) is the driver cleaning up after the process ended: beside
    another Xid on the node it follows that one (a symptom); alone it only says a process was
    torn down, which every killed CUDA program does (context: not even an affected node)."""
    from helpers import folder
    from sattrib.analysis import analyze_folder
    teardown = "kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=18189, name=python3, Ch 00000008\n"
    lost = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    d, _ = analyze_folder(folder(tmp_path / "a", {"node-01/journal.log": teardown}),
                          rules=rules)
    assert [e.role.value for e in d.evidence if ": 45," in e.text] in ([], ["context"])
    assert d.affected_nodes == [] and d.symptoms == []
    d, _ = analyze_folder(folder(tmp_path / "b", {"node-01/journal.log": lost + teardown}),
                          rules=rules)
    assert d.root_cause.category.value == "gpu_hardware"
    assert [e.role.value for e in d.evidence if ": 45," in e.text] == ["symptom"]


def test_the_drivers_recovery_action_decides_reboot_or_reset(tmp_path, rules):
    """A GSP timeout the driver follows with "GPU Reset Required" (Xid 154, recovery action
    0x1) is a GPU reset; followed with "Node Reboot Required" (0x2), a reboot."""
    from helpers import folder
    from sattrib.analysis import analyze_folder
    gsp = ("2026-01-01T00:00:00+0000 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 119, pid=1, "
           "Timeout after 6s of waiting for RPC response from GPU4 GSP!\n")
    then = ("2026-01-01T00:00:01+0000 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 154, GPU "
            "recovery action changed from 0x0 (None) to {}\n")
    for name, action, code in (("reset", "0x1 (GPU Reset Required)", "reset_gpu"),
                               ("reboot", "0x2 (Node Reboot Required)", "reboot_node")):
        d, _ = analyze_folder(folder(tmp_path / name, {"n1/journal.log": gsp + then.format(
            action)}), rules=rules)
        assert (d.root_cause.category.value, d.action_code.value) == ("gpu_hardware", code)


@pytest.fixture
def policy_file(monkeypatch, tmp_path):
    """Read the Xid policy from a given text instead of the package's table."""
    def use(text):
        path = tmp_path / "xid_policy.tsv"
        path.write_text(text)
        monkeypatch.setattr(xid, "POLICY_PATH", path)
        xid._policy_text.cache_clear()
        xid.policy.cache_clear()
    yield use
    xid._policy_text.cache_clear()
    xid.policy.cache_clear()


HEAD = "xid\tcategory\trole\taction\tweak\ttag\tdecode\tnote\n"


@pytest.mark.parametrize("row,needle", [
    ("79\tgpu_hardwre\troot\treboot_node\tno\tdevice_lost\t-\tx", "gpu_hardwre"),
    ("79\tgpu_hardware\troot\treboot_nod\tno\tdevice_lost\t-\tx", "reboot_nod"),
    ("79\tgpu_hardware\troot\treboot_node\tno\tdevice_gone\t-\tx", "device_gone"),
    ("74\tnvlink\troot\tinspect_nvlink\tno\t-\tnvlink47\tx", "unknown decode 'nvlink47'"),
    ("74\tnvlink\troot\tinspect_nvlink\tmaybe\t-\tnvlink74\tx", "weak is yes or no"),
    ("999\tnvlink\troot\tinspect_nvlink\tno\t-\tnvlink74\tx", "Xid 999 is not in the catalog"),
    ("79\tgpu_hardware\troot\treboot_node\tno\tdevice_lost\t-", "8 tab-separated columns"),
])
def test_a_typo_in_the_xid_policy_is_refused_when_the_rules_load(policy_file, row, needle):
    from sattrib.engine.rules import RuleError, load_rules
    policy_file("# comment\n" + HEAD + "45\tapplication_error\tsymptom\tnone\tno\t"
                "channel_teardown\tfollows\tx\n" + row + "\n")
    with pytest.raises(RuleError, match="xid_policy.tsv:4: .*" + needle.replace("(", r"\(")):
        load_rules(cache=False)


def test_a_repeated_code_in_the_xid_policy_is_refused(policy_file):
    row = "79\tgpu_hardware\troot\treboot_node\tno\tdevice_lost\t-\tx\n"
    policy_file(HEAD + row + row)
    with pytest.raises(ValueError, match="xid_policy.tsv:3: Xid 79 is repeated"):
        xid.policy()


def test_the_policy_row_decides_how_an_xid_is_read(policy_file):
    """The engine reads the row, not the code: 79 read as a lost device, then as a plain
    PCIe fault once its row is gone."""
    assert xid.classify(79, "").action.value == "reboot_node"
    assert "device_lost" in xid.classify(79, "").tags
    policy_file(HEAD)
    v = xid.classify(79, "")
    assert (v.category, v.weak, v.tags) == (Category.pcie, True, set())

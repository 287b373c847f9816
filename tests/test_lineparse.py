"""Timestamps and prefixes in the common log forms."""
from sattrib.engine.lineparse import HOST, SRUN, TimeContext, clean, iso_utc, split_prefix, tagging

REF = 1775988600.0  # 2026-04-12T10:10:00Z
tc = TimeContext(REF)


def t(line, srun=False):
    p = split_prefix(clean(line), SRUN if srun else "")
    return p, iso_utc(tc.epoch(p.stamp))


def test_syslog_kernel_line():
    p, ts = t("Apr 12 10:09:58 gn02 kernel: [51234.1] NVRM: Xid (PCI:0000:3b:00): 79, x")
    assert p.ident == "kernel" and p.host == "gn02" and ts == "2026-04-12T10:09:58Z"
    assert p.message.startswith("NVRM: Xid")


def test_iso_with_offset_and_micros():
    p, ts = t("2025-06-11T12:40:51.482913+02:00 dgx-22 kernel: NVRM: Xid")
    assert ts == "2025-06-11T10:40:51.482913Z" and p.stamp.res == 1e-6


def test_dmesg_forms():
    p, ts = t("[Tue Jun  3 16:41:20 2025] NVRM: Xid (PCI:0000:4e:00): 48")
    assert p.kernel_form and ts == "2025-06-03T16:41:20Z"
    p, ts = t("[  130.456250] [ T1946] NVRM: Xid (PCI:0000:4e:00): 48")
    assert p.kernel_form and ts is None and p.message.startswith("NVRM")
    p, _ = t("4,9921,9370042162,-;NVRM: Xid (PCI:0000:17:00): 119, x")
    assert p.kernel_form and p.message.startswith("NVRM")
    # A syslog export stamped dmesg-style: the host and `kernel:` are peeled too.
    p, ts = t("[Sun Dec  1 14:54:40 2024] gpu-a1 kernel: mlx5_core 0000:5c:00.0: x")
    assert (p.host, p.ident, p.message) == ("gpu-a1", "kernel", "mlx5_core 0000:5c:00.0: x")
    assert ts == "2024-12-01T14:54:40Z"


def test_srun_rank_glog_and_python_logging():
    p, ts = t("36: [rank36]:[E0412 10:09:59.134902082 ProcessGroupNCCL.cpp:1601] boom", srun=True)
    assert p.rank == 36 and ts == "2026-04-12T10:09:59.134902Z"
    p, ts = t(" 0: 2026-04-12 10:05:00,001 INFO [train.py:88] step 1200", srun=True)
    assert p.rank == 0 and ts == "2026-04-12T10:05:00.001000Z"


def test_nccl_host_prefix():
    p, _ = t("gn02:2002:2102 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion")
    assert p.nccl_host == "gn02" and p.nccl_dev == 1


def test_year_less_stamps_across_new_year():
    ctx = TimeContext(1767223800.0)  # 2025-12-31T23:30:00Z
    dec = ctx.epoch(split_prefix("Dec 31 23:59:59 n kernel: x").stamp)
    jan = ctx.epoch(split_prefix("Jan 01 00:00:01 n kernel: x").stamp)
    assert iso_utc(dec) == "2025-12-31T23:59:59Z" and iso_utc(jan) == "2026-01-01T00:00:01Z"


def test_clean_removes_ansi_and_control():
    assert clean("\x1b[31mred\x1b[0m\x00x") == "red\ufffdx"


def test_feb_29_and_garbage_do_not_crash():
    st = split_prefix("Feb 29 10:00:00 n kernel: x").stamp
    assert TimeContext(REF).epoch(st) is None          # no leap year within a year of 2026
    assert iso_utc(TimeContext(1835000000.0).epoch(st)) == "2028-02-29T10:00:00Z"
    assert split_prefix("\ufffd\ufffd [ 9999999999999999999.1] x").message


def test_a_line_glued_after_a_progress_bar_starts_after_the_bar():
    # tqdm frames end without a newline; whatever is printed next lands on the same line.
    p = split_prefix("  8%|\u258a         | 4/50 [46:11<8:50:58, 692.57s/it]slurmstepd: error: "
                     "*** JOB 41994 ON node-01 CANCELLED AT 2022-04-14T14:03:49 ***")
    assert p.message.startswith("slurmstepd: error: *** JOB 41994")
    p = split_prefix("12: train:  45%|####5     | 9/20 [00:01<00:02,  5.31it/s][rank12]: "
                     "RuntimeError: boom", SRUN)
    assert (p.rank, p.message) == (12, "RuntimeError: boom")
    # A line that only looks a little like a bar is left alone.
    assert split_prefix("accuracy 45%| best so far").message == "accuracy 45%| best so far"


def test_pdsh_tags_each_line_with_its_host():
    # DeepSpeed's multi-node launcher runs pdsh, which prints "<host>: <line>".
    lines = ["[2023-06-01 10:00:00,000] [INFO] [runner.py:550] cmd = pdsh -S -f 1024 -w "
             "node-01,node-02 export NCCL_DEBUG=WARN; cd /work; python train.py",
             "node-01:     ret = input.softmax(dim, dtype=dtype)",
             "node-02: [rank4]: step 10",
             "node-01: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB"]
    assert tagging(lines) == HOST
    p = split_prefix(lines[3], HOST)
    assert (p.tagged_host, p.message) == ("node-01", "torch.cuda.OutOfMemoryError: CUDA out of "
                                                     "memory. Tried to allocate 896.00 MiB")
    assert split_prefix(lines[2], HOST).rank == 4
    # A program's own "Name: text" lines are no host tags: a host name has a digit.
    plain = ["Traceback (most recent call last):", "RuntimeError: boom", "ValueError: x",
             "Warning: y", "INFO: z"]
    assert tagging(plain) == ""
    assert split_prefix("RuntimeError: boom").tagged_host is None
    assert tagging(["0: a", "1: b", "2: c"]) == SRUN

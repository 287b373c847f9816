"""Kernel records: where a rule may begin to read one.

The kernel quotes names that users choose: a task's name (its comm, up to 15 bytes), the file a
faulting program ran from, a path. A program mapped from a file named `NVRM: Xid (PCI:...): 79,
...` makes the kernel print `x[29915]: segfault at 0 ip ... error 4 in NVRM: Xid (PCI:...): 79,
...`, and a rule that read kernel records anywhere would take that for an Xid. So the rules read
a kernel record from where its printer's own words are:

- at the message's first character (`NVRM: ...`, `nvidia-nvswitch0: SXid ...`, `traps: ...`,
  `Out of memory: Killed process ...`), or right after the device a driver names first
  (dev_printk's `pcieport 0000:00:01.0: AER: ...`, netdev's `igb 0000:01:00.0 eno1: NIC Link is
  Down`);
- a record that a task printer begins with the task's name (`python[4821]: segfault at ...`,
  `python/4821: potentially unexpected fatal signal 11.`, `python invoked oom-killer: ...`)
  from the printer's words after the name. One that opens with a task's name and pid but whose
  printer is not listed here is not read at all: no rule is written for it, and its first words
  are the user's.

What follows a record's first words (the file of a segfault, the task an OOM report names) is
reached only by a rule that matched from there, and the generic kernel catalog's rows are
anchored too (engine/catalogs/kernel.tsv).
"""
from __future__ import annotations

import re

# dev_printk's "<driver> <PCI address>: " and netdev_printk's "<driver> <PCI address> <ifname>: "
# (up to the interface: rules that name it read it).
_DEVICE = re.compile(rb"[\w.-]{1,40} [0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]"
                     rb":? ")
# A task's name: at most 15 bytes (TASK_COMM_LEN), each shown as itself, as a \xNN escape (dmesg,
# /dev/kmsg) or within a UTF-8 character (U+FFFD where the reader replaced a byte).
_COMM = rb"(?:\\x[0-9a-fA-F]{2}|[\xc0-\xff][\x80-\xbf]{1,3}|[^\\]){1,15}?"
# Printers that begin a record with the task's name (x86 show_signal_msg, bad frame and vsyscall
# reports, arm64_show_signal, print_fatal_signal, the OOM killer's dump_header, warn_alloc).
_TASK_FIRST = re.compile(
    rb"^" + _COMM + rb"(?:\[\d+\]: (?=segfault at |unhandled )|\[\d+\] (?=bad frame in |vsyscall )"
    rb"|/\d+: (?=potentially unexpected fatal signal )| (?=invoked oom-killer: )"
    rb"|: (?=page allocation failure))", re.S)
# Any other record that opens with a task's name and pid (`comm (pid): drop_caches`, ...); the
# traps and umip printers put their own word before the name.
_TASK_NAMED = re.compile(rb"^(?!traps: |umip: )" + _COMM + rb"(?:\[\d+\]|/\d+:| \(\d+\))", re.S)


def starts(message: bytes) -> tuple[int, ...]:
    """The byte offsets in a kernel message where a rule may begin to match."""
    m = _TASK_FIRST.match(message)
    if m:
        return (m.end(),)
    if _TASK_NAMED.match(message):
        return ()
    m = _DEVICE.match(message)
    return (0, m.end()) if m else (0,)

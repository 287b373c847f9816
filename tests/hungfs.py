"""A FUSE filesystem whose server never answers: any access under it blocks in the kernel, as
on an NFS mount whose server went away (hard mount). Needs root and /dev/fuse; no libfuse.

The server answers the kernel's FUSE_INIT and nothing else. close() unmounts it (lazily) and
closes the device, which aborts the connection: what was blocked gets ENOTCONN and returns.
"""
from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

FUSE_INIT = 26


class HungMount:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        libc = ctypes.CDLL(None, use_errno=True)
        self._libc = libc
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0".encode()
        if libc.mount(b"sattrib-hungfs", str(self.path).encode(), b"fuse", 0, opts) != 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, os.strerror(err))
        req = os.read(self.fd, 1 << 20)
        _, opcode, unique = struct.unpack_from("<IIQ", req)
        if opcode != FUSE_INIT:
            self.close()
            raise OSError(0, f"unexpected first FUSE request {opcode}")
        _, minor = struct.unpack_from("<II", req, 40)
        # fuse_init_out (64 bytes): major, minor, max_readahead, flags, max_background,
        # congestion_threshold, max_write, time_gran, max_pages, map_alignment, unused.
        body = struct.pack("<IIIIHHIIHH", 7, min(minor, 31), 0, 0, 0, 0, 4096, 0, 0, 0)
        body += b"\0" * (64 - len(body))
        os.write(self.fd, struct.pack("<IiQ", 16 + len(body), 0, unique) + body)

    def close(self) -> None:
        if self.fd is None:
            return
        self._libc.umount2(str(self.path).encode(), 2)        # MNT_DETACH
        os.close(self.fd)
        self.fd = None

"""Run the router as a container whose seccomp profile refuses io_uring would.

``python -m tests.support.no_io_uring ARGS`` installs a seccomp filter that answers
``io_uring_setup`` with EPERM, as the default profiles of containerd 2 and Docker 25 do (and so
Kubernetes' ``RuntimeDefault`` on containerd 2), then runs ``python -m router ARGS`` under it.
x86-64 Linux only; every other system call (and every other architecture's) is allowed.
"""

from __future__ import annotations

import ctypes
import errno
import runpy
import sys

NR_IO_URING_SETUP = 425
"""``io_uring_setup``'s number (x86-64's table; the same in every architecture's since Linux 5.1)."""
AUDIT_ARCH_X86_64 = 0xC000003E
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ERRNO, RET_ALLOW = 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
"""Classic BPF opcodes: load a word of ``seccomp_data``, jump if equal, return."""


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def refuse_io_uring() -> None:
    """From now on, in this process and what it execs, ``io_uring_setup`` fails with EPERM."""
    program = [
        (LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (JEQ_K, 0, 3, AUDIT_ARCH_X86_64),  # another architecture: allow
        (LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (JEQ_K, 0, 1, NR_IO_URING_SETUP),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    filters = (SockFilter * len(program))(*(SockFilter(*op) for op in program))
    fprog = SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    calls = ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0))
    for call in calls:
        if libc.prctl(*(ctypes.c_ulong(arg) for arg in call)) != 0:
            raise OSError(ctypes.get_errno(), "prctl")


if __name__ == "__main__":
    refuse_io_uring()
    sys.argv[0] = "router"
    runpy.run_module("router", run_name="__main__", alter_sys=True)

"""Refuse system calls for real: a seccomp filter (as container runtimes install) that makes the
named calls fail with an errno in this process and every process it starts. Used where a test
needs a host without a kernel feature (pidfds) that this machine has."""

from __future__ import annotations

import ctypes
import errno as errnos
import platform

#: Numbers of the calls tests refuse; the same on x86_64 and aarch64 (numbered for every
#: architecture alike since Linux 5.1).
SYSCALLS = {"pidfd_send_signal": 424, "pidfd_open": 434}
_SUPPORTED = ("x86_64", "aarch64")

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_BPF_LD_W_ABS = 0x20  # load the 32-bit word at an offset of seccomp_data (0: the call's number)
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in _SUPPORTED


def refuse(*names: str, errno: int = errnos.ENOSYS) -> None:
    """From now on, the calls `names` fail with `errno` in this process and its children (for
    good: a seccomp filter cannot be removed)."""
    numbers = [SYSCALLS[name] for name in names]
    program = [_Instruction(_BPF_LD_W_ABS, 0, 0, 0)]
    for index, number in enumerate(numbers):  # a match jumps past the rest and the allow, to the refusal
        program.append(_Instruction(_BPF_JEQ_K, len(numbers) - index, 0, number))
    program.append(_Instruction(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    program.append(_Instruction(_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno))
    instructions = (_Instruction * len(program))(*program)
    fprog = _Program(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")

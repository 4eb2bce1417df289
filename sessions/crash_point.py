"""Make a child process that dies in native code say where.

faulthandler prints the Python frames of a fatal signal, but on Python 3.11 not the native
function it happened in, and that is what tells "an AMX instruction in ggml" from "a bad pointer
in libhdf5". `enable()` turns faulthandler on, then puts in front of it a handler that writes one
line to stderr,

    crash-point SIGILL at 0x7f3a1c2e2a40 in /…/libggml-cpu.so+0x1e2a40 (ggml_backend_amx_mul_mat+0x44)

and hands the signal back to faulthandler, which prints the Python frames and ends the process
by the same signal, so the parent still sees it die by SIGILL.

The name comes from `dladdr1`: only exported (dynamic) symbols, and only when the address lies
inside the symbol's size; otherwise the library and offset alone (`addr2line` takes those).
Native names stay as the linker has them (C++ names mangled); the parent demangles.

Only illegal instructions, bad memory accesses and arithmetic traps are caught (SIGILL,
SIGSEGV, SIGBUS, SIGFPE), on Linux, whose siginfo/ucontext layouts are read by offset. SIGABRT
is left to faulthandler alone: an abort can come from inside malloc with its lock held, where
running Python would hang the dying process. The handler runs Python inside a signal handler,
which is tolerable only because the process is dying anyway; an alarm bounds it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import platform
import signal
import sys

PREFIX = "crash-point"
CAUGHT = (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE)
HANDLER_SECONDS = 10
"""If describing the crash itself hangs, SIGALRM ends the process after this long."""

_SA_SIGINFO = 0x4
_SA_ONSTACK = 0x08000000
_RTLD_DL_SYMENT = 1
_SI_ADDR_OFFSET = 16
"""Offset of si_addr in a 64-bit Linux siginfo_t (three ints and padding come first)."""
_X86_64_RIP_OFFSET = 40 + 16 * 8
"""ucontext_t on x86-64 Linux: uc_flags, uc_link, uc_stack (40 bytes), then gregs[], RIP is gregs[16]."""


class _SigAction(ctypes.Structure):
    """glibc's `struct sigaction` (64-bit Linux): handler, 1024-bit mask, flags, restorer."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("fname", ctypes.c_char_p),
        ("fbase", ctypes.c_void_p),
        ("sname", ctypes.c_char_p),
        ("saddr", ctypes.c_void_p),
    ]


class _ElfSym(ctypes.Structure):
    """Elf64_Sym: the symbol table entry `dladdr1` hands back, for the symbol's size."""

    _fields_ = [
        ("name", ctypes.c_uint32),
        ("info", ctypes.c_ubyte),
        ("other", ctypes.c_ubyte),
        ("shndx", ctypes.c_uint16),
        ("value", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    ]


_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_installed: dict[int, _SigAction] = {}
"""Signal -> the action that was in place before ours (faulthandler's)."""
_keep: list[object] = []
"""The ctypes callback and libc handle, alive for the process's lifetime (a freed callback crashes)."""


def describe_address(address: int) -> str:
    """`/lib/x.so+0x1234 (symbol+0x10)` for a code address, as far as the dynamic linker knows it."""
    libc = ctypes.CDLL(None)
    info, symbol = _DlInfo(), ctypes.POINTER(_ElfSym)()
    dladdr1 = libc.dladdr1
    dladdr1.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo), ctypes.POINTER(ctypes.POINTER(_ElfSym)), ctypes.c_int]
    if not dladdr1(ctypes.c_void_p(address), ctypes.byref(info), ctypes.byref(symbol), _RTLD_DL_SYMENT) or not info.fname:
        return "anonymous memory (no library)"
    where = f"{os.fsdecode(info.fname)}+{address - (info.fbase or 0):#x}"
    if info.sname and info.saddr and symbol and address < info.saddr + symbol.contents.size:
        where += f" ({info.sname.decode('ascii', 'replace')}+{address - info.saddr:#x})"
    return where


def _code_address(signum: int, info: int, context: int) -> int | None:
    """The instruction that faulted: RIP on x86-64; elsewhere si_addr, which is the instruction
    only for SIGILL and SIGFPE (for SIGSEGV and SIGBUS it is the data address)."""
    if platform.machine() == "x86_64" and context:
        return ctypes.c_uint64.from_address(context + _X86_64_RIP_OFFSET).value
    if signum in (signal.SIGILL, signal.SIGFPE) and info:
        return ctypes.c_uint64.from_address(info + _SI_ADDR_OFFSET).value
    return None


def _on_fatal(signum: int, info: int, context: int) -> None:
    libc = _keep[1]
    assert isinstance(libc, ctypes.CDLL)
    libc.alarm(HANDLER_SECONDS)
    try:
        name = signal.Signals(signum).name
        os.write(2, f"\n{PREFIX} {name}".encode())
        address = _code_address(signum, info, context)
        text = f" at {address:#x} in {describe_address(address)}" if address is not None else ""
        os.write(2, f"{text}\n".encode())
    except BaseException:  # noqa: BLE001  (nothing may escape a signal handler)
        os.write(2, b"\n")
    libc.sigaction(signum, ctypes.byref(_installed[signum]), None)
    # Back to faulthandler: a fault re-executes the instruction under it; a sent signal is sent again.
    getattr(libc, "raise")(signum)


def enable() -> None:
    """faulthandler for every fatal signal, and on Linux the crash-point line in front of it."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if sys.platform != "linux" or _installed:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    handler = _HANDLER_TYPE(_on_fatal)
    _keep.extend([handler, libc])
    action = _SigAction()
    action.handler = ctypes.cast(handler, ctypes.c_void_p).value
    action.flags = _SA_SIGINFO | _SA_ONSTACK
    for signum in CAUGHT:
        previous = _SigAction()
        if libc.sigaction(int(signum), ctypes.byref(action), ctypes.byref(previous)) == 0:
            _installed[int(signum)] = previous

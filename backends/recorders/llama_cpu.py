"""What a llama.cpp build uses against what this CPU and OS grant.

ggml compiles its CPU kernels for a set of instruction-set extensions (`llama_print_system_info`:
`CPU : SSE3 = 1 | AVX2 = 1 | ... | AMX_INT8 = 1 | REPACK = 1 |`). A build made with native
tuning on one machine runs an instruction another machine lacks, and dies by SIGILL: on a
Sapphire Rapids VM, AMX tile instructions that the CPU has but the OS never enabled. The
extensions also decide which kernels run, so they change bits: recorders keep the string in
provenance, `parity-xray doctor` and the crash explanation compare it with what is granted.

What is granted on Linux: the flags the kernel lists in /proc/cpuinfo (it drops those whose
register state it does not manage); AMX additionally needs the kernel to offer the tile-data
state to processes (arch_prctl ARCH_GET_XCOMP_SUPP, Linux 5.16+), which a VM or older kernel
may not. Elsewhere (macOS) the flags are not read and nothing is called missing.
"""

from __future__ import annotations

import ctypes
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
PORTABLE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF "
    "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
"""What the Makefile builds llama-cpp-python with on x86-64 (kept equal by a test)."""
REBUILD_COMMAND = (
    f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" .venv/bin/python -m pip install --force-reinstall --no-deps '
    "--no-cache-dir -c constraints.txt llama-cpp-python"
)
"""A portable rebuild in place; `make clean test` does the same from scratch."""

FEATURE_FLAGS: dict[str, tuple[str, ...]] = {
    "SSE3": ("pni",),
    "SSSE3": ("ssse3",),
    "AVX": ("avx",),
    "AVX_VNNI": ("avx_vnni",),
    "AVX2": ("avx2",),
    "F16C": ("f16c",),
    "FMA": ("fma",),
    "BMI2": ("bmi2",),
    "AVX512": ("avx512f",),
    "AVX512_VBMI": ("avx512vbmi",),
    "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",),
    "AMX_INT8": ("amx_tile", "amx_int8"),
    "NEON": ("asimd",),
    "ARM_FMA": ("asimd",),
    "FP16_VA": ("asimdhp",),
    "DOTPROD": ("asimddp",),
    "MATMUL_INT8": ("i8mm",),
    "SVE": ("sve",),
    "SME": ("sme",),
}
"""ggml's CPU feature name -> the /proc/cpuinfo flags it needs. Names not listed (LLAMAFILE,
OPENMP, REPACK, ACCELERATE) are build options, not instructions."""
OS_GRANTED = {"AMX_INT8"}
"""Features that also need the kernel to hand the register state to the process."""

_ARCH_GET_XCOMP_SUPP = 0x1021
_SYS_ARCH_PRCTL = 158
"""x86-64 syscall number of arch_prctl."""
_XFEATURE_XTILEDATA = 18
_ENTRY = re.compile(r"^\s*(?:(?P<backend>[A-Za-z0-9_ .-]+?)\s*:\s*)?(?P<key>[A-Z0-9_]+)\s*=\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class BuildFeatures:
    """One backend section of a system info string: `CPU` -> {`AVX2`: `1`, ...}."""

    sections: dict[str, dict[str, str]]

    @property
    def cpu(self) -> dict[str, str]:
        return self.sections.get("CPU", {})

    def cpu_features_on(self) -> list[str]:
        """The CPU section's entries switched on, in the order the build lists them."""
        return [key for key, value in self.cpu.items() if value == "1"]


def parse_system_info(text: str) -> BuildFeatures:
    """`CPU : SSE3 = 1 | AVX2 = 1 | Metal : EMBED_LIBRARY = 1 |` -> sections by backend."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for part in text.split("|"):
        found = _ENTRY.match(part)
        if not found:
            continue
        current = (found.group("backend") or current).strip()
        sections.setdefault(current, {})[found.group("key")] = found.group("value")
    return BuildFeatures(sections)


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The first processor's flags (`flags` on x86, `Features` on Arm); None where there is no cpuinfo."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    found = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(found.group(1).split()) if found else frozenset()


def os_grants_amx() -> bool:
    """Whether the kernel offers AMX tile data to processes (ARCH_GET_XCOMP_SUPP, bit 18).

    The query changes nothing (ggml itself then asks for the permission with ARCH_REQ_XCOMP_PERM).
    An older kernel answers EINVAL: no AMX for anyone."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    supported = ctypes.c_uint64(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, ctypes.byref(supported)) != 0:
        return False
    return bool(supported.value >> _XFEATURE_XTILEDATA & 1)


def ungranted(build: BuildFeatures, flags: frozenset[str] | None, amx_granted: bool) -> list[str]:
    """The build's CPU features this machine does not grant, each with why (empty: it can run here)."""
    if flags is None:
        return []
    missing: list[str] = []
    for feature in build.cpu_features_on():
        needed = FEATURE_FLAGS.get(feature)
        if needed is None:
            continue
        lacking = [flag for flag in needed if flag not in flags]
        if lacking:
            missing.append(f"{feature} (the CPU lists no {', '.join(lacking)})")
        elif feature in OS_GRANTED and not amx_granted:
            missing.append(f"{feature} (the CPU has it, the OS does not grant it to processes)")
    return missing

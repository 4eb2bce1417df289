"""A ctypes mirror of `struct ggml_tensor`, and the run-time proof that it fits the loaded library.

llama.cpp's eval callback hands over bare `struct ggml_tensor *` pointers. Reading a node's
type, shape, strides, op, sources and name means laying a Python struct over that memory,
and a struct that is off by one field reads garbage that looks like data. So nothing is read
until `check_layout` has proved the mirror right against the library actually loaded:

- `ggml_tensor_overhead()` is `sizeof(struct ggml_object)` (32 bytes) + `sizeof(struct ggml_tensor)`;
- for a tensor the library itself created, `ggml_get_name` returns the address of the name
  field, and type, shape, strides, op and name read through the mirror equal what was asked.

Offsets measured in llama-cpp-python 0.3.36's vendored ggml.h: 336 bytes; type at 0, ne[4] at
16, nb[4] at 48, op at 80, src[10] at 152, view_src at 232, data at 248, name[64] at 256.
A different version that moved a field is refused with a message naming it.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_OBJECT_SIZE = 32
"""sizeof(struct ggml_object) on 64-bit platforms: offs, size, next (8 bytes each), type + padding."""
GGML_TYPE_F32 = 0
GGML_OP_NONE = 0


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml as vendored by llama-cpp-python 0.3.36."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class StructLayoutError(RuntimeError):
    """The ctypes mirror does not match the loaded ggml: reading would return garbage."""


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@dataclass(frozen=True)
class GgmlLibrary:
    """The few ggml-base functions a recorder calls, with their C signatures declared."""

    lib: ctypes.CDLL
    path: Path
    version: str
    """The llama-cpp-python version the library came with (named in every refusal)."""

    @classmethod
    def load(cls) -> "GgmlLibrary":
        import llama_cpp

        lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
        candidates = sorted(lib_dir.glob("libggml-base.*")) + sorted(lib_dir.glob("ggml-base.*"))
        if not candidates:
            raise StructLayoutError(f"llama-cpp-python {llama_cpp.__version__}: no libggml-base in {lib_dir}")
        mode = os.RTLD_GLOBAL if hasattr(os, "RTLD_GLOBAL") else 0
        lib = ctypes.CDLL(str(candidates[0]), mode=mode)
        library = cls(lib, candidates[0], str(llama_cpp.__version__))
        library._declare()
        return library

    def _declare(self) -> None:
        lib, p, size, c_str = self.lib, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        signatures = {
            "ggml_tensor_overhead": ([], size),
            "ggml_get_name": ([p], p),
            "ggml_op_desc": ([p], c_str),
            "ggml_type_name": ([ctypes.c_int], c_str),
            "ggml_nbytes": ([p], size),
            "ggml_blck_size": ([ctypes.c_int], ctypes.c_int64),
            "ggml_type_size": ([ctypes.c_int], size),
            "ggml_backend_tensor_get": ([p, p, size, size], None),
            "ggml_backend_buffer_is_host": ([p], ctypes.c_bool),
            "ggml_init": ([_InitParams], p),
            "ggml_free": ([p], None),
            "ggml_new_tensor_4d": ([p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], p),
            "ggml_set_name": ([p, c_str], p),
        }
        for name, (argtypes, restype) in signatures.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = restype

    def op_desc(self, address: int) -> str:
        return (self.lib.ggml_op_desc(address) or b"").decode("utf-8", "replace")

    def type_name(self, ggml_type: int) -> str:
        return (self.lib.ggml_type_name(ggml_type) or b"").decode("utf-8", "replace")


def tensor_at(address: int, mirror: type[ctypes.Structure] = GgmlTensor) -> ctypes.Structure:
    return mirror.from_address(address)


def _refuse(library: GgmlLibrary, problem: str) -> StructLayoutError:
    return StructLayoutError(
        f"llama-cpp-python {library.version} ({library.path}): the ggml_tensor mirror does not fit this "
        f"build ({problem}); the recorder knows the layout of 0.3.36 and refuses to read node memory"
    )


def check_layout(library: GgmlLibrary, mirror: type[ctypes.Structure] = GgmlTensor) -> None:
    """Prove `mirror` right against `library` on a tensor the library allocates; raise if not."""
    lib = library.lib
    overhead = int(lib.ggml_tensor_overhead())
    if overhead != GGML_OBJECT_SIZE + ctypes.sizeof(mirror):
        raise _refuse(library, f"ggml_tensor_overhead() is {overhead}, the mirror implies {GGML_OBJECT_SIZE} + {ctypes.sizeof(mirror)}")
    context = lib.ggml_init(_InitParams(overhead * 2, None, True))
    if not context:
        raise _refuse(library, "ggml_init failed")
    try:
        shape = (3, 5, 7, 11)
        address = lib.ggml_new_tensor_4d(context, GGML_TYPE_F32, *shape)
        lib.ggml_set_name(address, b"parity-xray-layout-check")
        view = tensor_at(address, mirror)
        name_offset = mirror.name.offset  # type: ignore[attr-defined]
        name_address = lib.ggml_get_name(address)
        if name_address != address + name_offset:
            raise _refuse(library, f"ggml_get_name is at struct + {name_address - address}, the mirror says + {name_offset}")
        strides = (4, 4 * 3, 4 * 3 * 5, 4 * 3 * 5 * 7)
        seen = (view.type, tuple(view.ne), tuple(view.nb), view.op, view.name)  # type: ignore[attr-defined]
        wanted = (GGML_TYPE_F32, shape, strides, GGML_OP_NONE, b"parity-xray-layout-check")
        if seen != wanted:
            raise _refuse(library, f"a fresh F32 tensor {list(shape)} reads as (type, ne, nb, op, name) = {seen}")
    finally:
        lib.ggml_free(context)


def load_checked() -> GgmlLibrary:
    """libggml-base of the installed llama-cpp-python, after `check_layout` passed."""
    library = GgmlLibrary.load()
    check_layout(library)
    return library

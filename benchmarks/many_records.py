"""A native/oracle pair with a real model's record count: many small records in 36-layer token steps.

Shared by the benchmarks whose cost grows with records rather than bytes (the window's stall,
the report beside h5diff and cat); Qt-free, so the report's benchmark does not load Qt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
from sessions.capture.meta import CaptureMeta  # noqa: E402
from sessions.capture.writer import CaptureWriter  # noqa: E402

OP_NAMES = ("attn_norm", "q_proj", "k_proj", "v_proj", "sdpa", "o_proj", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down", "layer_out")
OPS_PER_LAYER = len(OP_NAMES)
STEP_RECORDS = 36 * OPS_PER_LAYER
"""A 36-layer model's ops per token step: 240,000 records are about 555 steps."""


def many_records_paths(directory: Path, records: int, shape: tuple[int, int] = (4, 16), diverged: bool = False) -> tuple[Path, Path]:
    """Where `build_many_records_pair` writes the pair, and finds it to reuse: by its name alone.
    "canonical": its op names are the canonical profile's. Pairs built before were named many-N and
    used llama.cpp's l_out, which the profile has no rule for."""
    name = f"many-canonical-{records}" + ("" if shape == (4, 16) else f"-{shape[0]}x{shape[1]}") + ("-diverged" if diverged else "")
    return directory / f"{name}.native.h5", directory / f"{name}.oracle.h5"


def build_many_records_pair(directory: Path, records: int, shape: tuple[int, int] = (4, 16), diverged: bool = False) -> tuple[Path, Path]:
    """A real model's record count: `records` bfloat16 tensors of `shape` per side in token steps of
    STEP_RECORDS, identical but for one bit in the record at 60% of the run (its first divergence);
    `diverged`: every record after it differs in most of its elements by 1-3 ULP, as in a run whose
    error, once made, reaches every later op and spreads over its elements."""
    import ml_dtypes

    native_path, oracle_path = many_records_paths(directory, records, shape, diverged)
    if native_path.exists() and oracle_path.exists():
        return native_path, oracle_path
    tensor = np.random.default_rng(12).standard_normal(shape).astype(ml_dtypes.bfloat16)
    flipped = tensor.copy()
    flipped.view(np.uint16)[1, 3] ^= 1
    spread = (tensor.view(np.uint16) ^ np.random.default_rng(13).integers(0, 4, size=shape, dtype=np.uint16)).view(ml_dtypes.bfloat16)
    planted = records * 3 // 5
    common = {"model_id": "bench", "weights_hash": "sha256:bench", "prompt": "bench"}
    with CaptureWriter(native_path, CaptureMeta(role="native", engine_name="bench-native", **common)) as native, CaptureWriter(
        oracle_path, CaptureMeta(role="oracle", engine_name="bench-oracle", **common)
    ) as oracle:
        for seq in range(records):
            step, layer = seq // STEP_RECORDS, seq % STEP_RECORDS // OPS_PER_LAYER
            name = OP_NAMES[seq % OPS_PER_LAYER]
            oracle.add_tensor(name, tensor, step=step, segment="decode", layer=layer)
            native.add_tensor(name, flipped if seq == planted else spread if diverged and seq > planted else tensor, step=step, segment="decode", layer=layer)
            if seq % STEP_RECORDS == STEP_RECORDS - 1:
                for writer in (native, oracle):
                    writer.add_token(step=step, segment="decode", token_id=step % 100, is_stop=False)
                    writer.end_step()
    return native_path, oracle_path


def main(argv: list[str] | None = None) -> int:
    """Build such a pair by hand, to open it in the viewer or time a command on it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="where to write (and reuse) many-N.native.h5 and many-N.oracle.h5")
    parser.add_argument("--records", type=int, default=240_000, help="records per side (default 240000: a real 8B model's run)")
    parser.add_argument("--record-shape", default="4,16", help="rows,columns of each bfloat16 record (default 4,16: 128 bytes; 64,128 is 16 KiB)")
    parser.add_argument("--diverged", action="store_true", help="every record after 60%% of the run differs in most elements, not only that one in one bit")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows, columns = (int(n) for n in args.record_shape.split(","))
    for path in build_many_records_pair(args.dir, args.records, (rows, columns), diverged=args.diverged):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

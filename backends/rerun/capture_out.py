"""A rerun saved as a third capture (role `rerun`), openable beside the native and the oracle.

Records are named by canonical op and stored in canonical layout, so the built-in
`canonical` profile aligns them with either side; SDPA records carry one dispatch event per
primitive call the rerun made, with the primitive MLX took on the rerun's device. The
provenance says what was rerun, from which capture, on which route -- enough to run it
again.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import mlx.core as mx

from backends.engines.capture_sink import DispatchedCall, add_dispatch_events
from backends.rerun.segment import RerunResult
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.side_file import same_file

ENGINE_NAME = "parity-xray rerun (MLX)"


class ReplacesInput(OSError):
    """A save that would replace a file the rerun was computed from (a capture, a weights file)."""


def rerun_meta(result: RerunResult) -> CaptureMeta:
    """What the saved rerun says of itself. Its weights are the source capture's only when it took
    them from that capture or from the file a capture references: weights named for the rerun
    (`--weights`) leave `weights_hash` empty (hashing a multi-GB file to say so is not worth it), so a report
    never reads "same weights" for them; `weights_from` says where they came from."""
    source = result.source_meta
    return CaptureMeta(
        role="rerun",
        engine_name=ENGINE_NAME,
        engine_version=mx.__version__,
        model_id=str(source.get("model_id", "")),
        weights_hash="" if result.weights_named else str(source.get("weights_hash", "")),
        device=result.device,
        compiler=f"mlx {mx.__version__}",
        prompt=str(source.get("prompt", "")),
        seed=int(source.get("seed", 0)),
        provenance={
            "rerun_of": result.target.text(),
            "native_capture": result.native_path,
            "oracle_capture": result.oracle_path,
            "options": asdict(result.options),
            "routes": asdict(result.routes),
            "route_sources": result.route_sources,
            "notes": result.notes,
            "weights_from": result.weights_from,
            "config": source.get("provenance", {}).get("config", {}) if isinstance(source.get("provenance"), dict) else {},
        },
    )


def save_rerun(result: RerunResult, path: str | Path) -> Path:
    """Write the rerun's outputs as a complete capture at `path`, replacing any file there only
    once it is complete: a save that fails (a full disk) leaves `path` as it was.
    Raises OSError (FileUnwritable when the capture could not be written; ReplacesInput when
    `path` is a file the rerun was computed from, whoever asks: the window's Save offered any path)."""
    path = Path(path)
    if any(same_file(path, given) for given in result.input_files):
        raise ReplacesInput(f"{path} is one of the files this rerun was computed from: a saved rerun never replaces an input; choose another file")
    with CaptureWriter(path, rerun_meta(result), complete_only=True) as writer:
        _write_ops(writer, result)
    return path


def _write_ops(writer: CaptureWriter, result: RerunResult) -> None:
    for op in result.ops:
        key = op.key
        seq = writer.add_tensor(
            key.op,
            op.bits,
            step=key.step,
            segment=key.segment,
            layer=key.layer,
            position=key.positions[0] if key.positions else -1,  # paired by position, it pairs again where it was cut
            dtype=op.dtype,
            kernel_id=f"rerun.{key.op}",
            # No contract: the route is words ("attn.f32.tiled64x64, 1 unchunked call"), and an
            # engine's contract ids follow its own conventions; a rerun's routes are in its provenance.
            contract_id="",
            effective_contract_id="",
        )
        q_heads, kv_heads, head_dim = op.heads or (0, 0, 0)
        add_dispatch_events(
            writer,
            seq,
            (DispatchedCall(r.call, r.primitive, r.metal_primitive) for r in op.calls),
            q_heads=q_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            mask_kind=op.mask_kind or "none",
            dtype=op.dtype,
        )
    writer.end_step()


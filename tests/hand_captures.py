"""Small real captures, written record by record with CaptureWriter, for comparison tests.

Each test states its tensors and tokens in a few lines; the file on disk is a real capture
that the reader opens like any engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from sessions.capture.identity import identity_of_file
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.investigation.model import Investigation


def bf16_bits(values: list[float] | np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float values, rounded to nearest even."""
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


@dataclass
class T:
    """One tensor to write: name, data (a bit array with `dtype` set, or a typed array)."""

    name: str
    data: np.ndarray
    step: int = 0
    segment: str = "prefill"
    layer: int = -1
    dtype: str | None = None
    logical_shape: tuple[int, ...] | None = None
    """Of GGML blocks (`dtype` q8_0, ...)."""
    kernel_id: str = ""
    contract_id: str = ""
    effective_contract_id: str = ""
    dispatch: list[dict[str, Any]] = field(default_factory=list)
    position: int = -1
    attrs: dict[str, str] = field(default_factory=dict)
    """Recorder attributes of the tensor's dataset (e.g. llama.cpp's `ggml_src`)."""


def write_capture(
    path: Path,
    role: str,
    tensors: list[T],
    tokens: list[tuple[int, int, bool]] = (),  # type: ignore[assignment]
    layout: str = "packed",
    **meta: Any,
) -> Path:
    """Write `tensors` in order (steps flushed as they change) and `tokens` as (step, id, is_stop),
    in packs or (`layout="datasets"`) each tensor in a dataset of its own."""
    base = {"engine_name": f"hand-{role}", "model_id": "hand-model", "weights_hash": "sha256:aa", "prompt": "p", "device": "cpu"}
    base.update(meta)
    writer = CaptureWriter(path, CaptureMeta(role=role, **base), layout=layout)
    step = tensors[0].step if tensors else 0
    token_rows = list(tokens)
    for t in tensors:
        if t.step != step:
            _flush_tokens(writer, token_rows, step)
            writer.end_step()
            step = t.step
        seq = writer.add_tensor(
            t.name,
            t.data,
            step=t.step,
            segment=t.segment,
            layer=t.layer,
            dtype=t.dtype,
            logical_shape=t.logical_shape,
            kernel_id=t.kernel_id,
            contract_id=t.contract_id,
            effective_contract_id=t.effective_contract_id,
            position=t.position,
            attrs=t.attrs,
        )
        for call, event in enumerate(t.dispatch):
            writer.add_dispatch(index_seq=seq, call=call, **event)
    _flush_tokens(writer, token_rows, None)
    writer.close()
    return path


def _flush_tokens(writer: CaptureWriter, rows: list[tuple[int, int, bool]], up_to: int | None) -> None:
    while rows and (up_to is None or rows[0][0] <= up_to):
        step, token, stop = rows.pop(0)
        writer.add_token(step=step, segment="decode" if step else "prefill", token_id=token, is_stop=stop)


def one_ulp_pair(tmp_path: Path) -> tuple[Path, Path]:
    """layer_out and logits, each with one element 1 ULP apart (layer_out first in execution order)."""
    out = bf16_bits([[1.0, 2.0, 3.0, 4.0]])
    logits = bf16_bits([[0.5, 1.5, 2.5, 3.5]])
    n_out, n_logits = out.copy(), logits.copy()
    n_out[0, 1] += 1
    n_logits[0, 2] += 1
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", n_out, layer=0, dtype="bfloat16"), T("logits", n_logits, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", out, layer=0, dtype="bfloat16"), T("logits", logits, dtype="bfloat16")])
    return native, oracle


def policy_file(tmp_path: Path, text: str) -> Path:
    """A tolerance policy TOML file holding `text`."""
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def pair_session(native: Path, oracle: Path, title: str) -> Investigation:
    """A new investigation of the pair, each capture named by its identity, as the window makes one."""
    session = Investigation(title=title)
    session.add_capture("native", native, identity_of_file(native))
    session.add_capture("oracle", oracle, identity_of_file(oracle))
    return session

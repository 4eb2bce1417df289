"""The llama.cpp recorder: a proven struct mirror, faithful node records, and logits capture cannot move."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from backends.demo.llama_pairs import demo_weights_f32  # noqa: E402
from backends.engines.demo_model import DemoConfig  # noqa: E402
from backends.engines.gguf_export import VARIANTS, export_gguf  # noqa: E402
from backends.recorders.ggml_tensor_struct import (  # noqa: E402
    GgmlLibrary,
    GgmlTensor,
    StructLayoutError,
    check_layout,
)
from backends.recorders.llama_nodes import RecorderError, node_view, request_ne  # noqa: E402
from backends.recorders.llama_process import iter_record_llama, plain_logits  # noqa: E402
from backends.recorders.llama_process_env import OPENMP_WAIT, brief_openmp_wait  # noqa: E402
from backends.recorders.llama_recorder import SRC_ATTR, LlamaSettings  # noqa: E402
from backends.recorders.record_schedule import TokenSchedule  # noqa: E402
from sessions.capture import format as cf  # noqa: E402
from sessions.capture.opening import open_capture  # noqa: E402
from sessions.capture.reader import Capture  # noqa: E402
from sessions.commands.validate import validate_file  # noqa: E402

TINY = DemoConfig(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, vocab_size=96, dead_gate_channels=2,
)
SCHEDULE = TokenSchedule((5, 17, 3, 88, 41), decode_steps=2)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("gguf")
    weights = demo_weights_f32(TINY, 3)
    return {v: export_gguf(TINY.as_dict(), weights, directory / f"tiny.{v}.gguf", v) for v in VARIANTS}


def _record(
    gguf: Path, out: Path, schedule: TokenSchedule = SCHEDULE, settings: LlamaSettings = LlamaSettings(), batch: int = 1, batch_row: int = 0
) -> list[np.ndarray]:
    work = iter_record_llama(gguf, schedule, out, settings, batch=batch, batch_row=batch_row)
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


def _sources(out: Path, capture: Capture, seq: int) -> list[str]:
    """The node's `ggml_src`, an element of its pack's table `ggml_src[]` (docs/capture-format.md, "Recorder attributes")."""
    with h5py.File(out, "r", locking=False) as file:
        table = file[capture.records[seq].path].attrs[cf.attribute_table(SRC_ATTR)]
    return json.loads(table[list(capture.pack_members(capture.records[seq].path)).index(seq)].decode())


def test_the_mirror_is_proven_against_the_installed_library() -> None:
    library = GgmlLibrary.load()
    check_layout(library)
    assert ctypes.sizeof(GgmlTensor) == 336
    assert (GgmlTensor.ne.offset, GgmlTensor.nb.offset, GgmlTensor.op.offset) == (16, 48, 80)
    assert (GgmlTensor.src.offset, GgmlTensor.data.offset, GgmlTensor.name.offset) == (152, 248, 256)


def _shifted_name_mirror() -> type[ctypes.Structure]:
    fields = [(n, t) for n, t in GgmlTensor._fields_ if n not in ("name", "extra")]
    fields += [("extra", ctypes.c_void_p), ("name", ctypes.c_char * 64)]
    return type("ShiftedName", (ctypes.Structure,), {"_fields_": fields})


def _short_mirror() -> type[ctypes.Structure]:
    return type("Short", (ctypes.Structure,), {"_fields_": [f for f in GgmlTensor._fields_ if f[0] != "padding"]})


@pytest.mark.parametrize(("mirror", "problem"), [(_shifted_name_mirror, "ggml_get_name is at struct + 256, the mirror says + 272"), (_short_mirror, "ggml_tensor_overhead() is 368, the mirror implies 32 + 328")])
def test_a_wrong_layout_is_refused_naming_the_installed_version(mirror, problem: str) -> None:  # type: ignore[no-untyped-def]
    import llama_cpp

    library = GgmlLibrary.load()
    with pytest.raises(StructLayoutError) as refused:
        check_layout(library, mirror())
    assert f"llama-cpp-python {llama_cpp.__version__}" in str(refused.value)
    assert problem in str(refused.value)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_records_a_valid_capture_whose_logits_are_llama_cpps_own(ggufs: dict[str, Path], tmp_path: Path, variant: str) -> None:
    out = tmp_path / "llama.h5"
    returned = _record(ggufs[variant], out)
    report = validate_file(out, 2**31, 60)
    assert report.problems == [] and report.complete
    with open_capture(out, check_in_child=False) as capture:
        steps = sorted({r.step for r in capture.records})
        recorded = [np.concatenate([capture.read_values(r) for r in capture.records if r.name == "result_output" and r.step == s]) for s in steps]
        assert [int(t) for t in capture.tokens["token_id"]] == [int(np.argmax(x[-1])) for x in returned]
        assert capture.meta.provenance["parity_settings"]["flash_attn"] is False
        assert capture.meta.provenance["parity_settings"]["kv_type"] == "f32"
        assert (capture.meta.device, capture.meta.provenance["parity_settings"]["n_gpu_layers"]) == ("cpu", 0), "a GPU build offloaded every layer"
        digest = hashlib.sha256(ggufs[variant].read_bytes()).hexdigest()  # what sha256sum prints, whatever the file is called
        assert (capture.meta.weights_hash, capture.meta.provenance["weights_sha256"]) == (f"sha256:{digest}", digest)
    assert len(recorded) == len(returned) == 3
    for mine, theirs in zip(recorded, returned, strict=True):
        assert mine.view(np.uint32).tobytes() == theirs.view(np.uint32).tobytes()
    for plain, recorded_run in zip(plain_logits(ggufs[variant], SCHEDULE), returned, strict=True):
        assert plain.tobytes() == recorded_run.tobytes()


def test_nodes_carry_op_sources_layer_and_occurrence(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out)
    with open_capture(out, check_in_child=False) as capture:
        layer0 = [r for r in capture.records if r.step == 0 and r.layer == 0]
        qcur = [(r.occurrence, r.kernel_id, r.shape) for r in layer0 if r.name == "Qcur-0"]
        assert qcur == [(0, "MUL_MAT", (5, 128)), (1, "RESHAPE", (5, 4, 32)), (2, "ROPE", (5, 4, 32))]
        norms = [r for r in layer0 if r.name == "norm-0"]
        assert [r.shape for r in norms] == [(5, 64), (5, 4, 32), (5, 2, 32), (5, 64)]
        assert [_sources(out, capture, r.seq)[0] for r in norms] == ["embd", "Qcur-0", "Kcur-0", "ffn_inp-0"]
        (projection,) = [r for r in layer0 if r.name.startswith("node_")]
        assert projection.kernel_id == "MUL_MAT"
        assert _sources(out, capture, projection.seq) == ["blk.0.attn_output.weight", "kqv_out-0"]
        decode_q = [r.shape for r in capture.records if r.step == 1 and r.name == "Qcur-0"]
        assert decode_q == [(1, 128), (1, 4, 32), (1, 4, 32)]


def test_views_read_without_stopping_the_graph_hold_the_bits_of_what_they_view(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out)
    with open_capture(out, check_in_child=False) as capture:
        for step in (0, 1):
            bits = {(r.name, r.kernel_id): capture.read_bits(r) for r in capture.records if r.step == step and r.layer == 0}
            projection, per_head = bits[("Qcur-0", "MUL_MAT")], bits[("Qcur-0", "RESHAPE")]
            assert per_head.shape == (projection.shape[0], 4, 32) and per_head.tobytes() == projection.tobytes()
            assert bits[("Kcur-0 (view)", "VIEW")].tobytes() == bits[("Kcur-0", "ROPE")].tobytes()
            assert bits[("kqv-0 (permuted)", "PERMUTE")].tobytes() == bits[("kqv-0", "MUL_MAT")].transpose(1, 0, 2).tobytes()


def test_each_attention_gets_one_dispatch_event_on_its_kqv_out(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out)
    with open_capture(out, check_in_child=False) as capture:
        by_seq = {r.seq: r for r in capture.records}
        events = [(by_seq[int(e["index_seq"])].name, int(e["q_rows"]), int(e["kv_len"]), int(e["q_heads"]), int(e["kv_heads"]), int(e["head_dim"]),
                   e["mask_kind"].decode(), e["primitive"].decode()) for e in capture.dispatch]
    prompt = len(SCHEDULE.prompt)
    assert events[:2] == [(f"kqv_out-{n}", prompt, 256, 4, 2, 32, "causal", "fallback") for n in range(2)]
    assert {e[6] for e in events} == {"causal"}, "a single sequence's KQ mask is the causal one, value for value, in decode too"
    assert len(events) == 2 * 3 and {e[1] for e in events[2:]} == {1}


def test_micro_batches_are_recorded_as_segments(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    schedule = TokenSchedule(SCHEDULE.prompt, decode_steps=1, ubatch=2)
    returned = _record(ggufs["f32"], out, schedule)
    with open_capture(out, check_in_child=False) as capture:
        logits = [(r.segment, r.shape) for r in capture.records if r.name == "result_output"]
        prefill = np.concatenate([capture.read_values(r) for r in capture.records if r.name == "result_output" and r.step == 0])
    assert logits == [("prefill.0", (2, 96)), ("prefill.1", (2, 96)), ("prefill.2", (1, 96)), ("decode", (1, 96))]
    assert prefill.tobytes() == returned[0].tobytes()


def test_a_batched_node_splits_by_request_only_where_its_elements_are_the_requests_in_turn() -> None:
    hidden_of_3x5_tokens, per_stream_scores, whole_k_cache = [64, 15, 1, 1], [256, 5, 4, 3], [64, 768, 1, 1]
    assert request_ne(hidden_of_3x5_tokens, rows=5, batch=3) == [64, 5, 1, 1]
    assert request_ne(per_stream_scores, rows=5, batch=3) == [256, 5, 4, 1]
    assert request_ne(whole_k_cache, rows=5, batch=3) is None


def test_a_node_is_read_through_its_strides_only_within_its_bytes() -> None:
    data = np.arange(16, dtype=np.uint8)
    transposed = node_view(data, np.dtype("<u2"), (2, 4), (2, 4))
    assert transposed.tolist() == node_view(data, np.dtype("<u2"), (4, 2), (4, 2)).T.tolist()
    with pytest.raises(RecorderError, match=r"shape \(2, 4\) and strides \(16, 2\) reach past its 16 bytes"):
        node_view(data, np.dtype("<u2"), (2, 4), (16, 2))


def test_a_batched_run_stacks_each_sequence_in_its_row_and_keeps_the_requests_tokens_and_logits(ggufs: dict[str, Path], tmp_path: Path) -> None:
    alone, batched = tmp_path / "alone.h5", tmp_path / "batch.h5"
    schedule = TokenSchedule(SCHEDULE.prompt, decode_steps=1, ubatch=2)
    own = _record(ggufs["f32"], alone, schedule)
    returned = _record(ggufs["f32"], batched, schedule, batch=3, batch_row=2)
    assert validate_file(batched, 2**31, 60).problems == []
    with open_capture(alone, check_in_child=False) as a, open_capture(batched, check_in_child=False) as b:
        assert (b.meta.batch_size, b.meta.batch_row, b.meta.batch_stacked) == (3, 2, True)
        assert (b.meta.provenance["batch"], b.meta.provenance["parity_settings"]["kv_unified"]) == (3, False)
        assert [int(t) for t in b.tokens["token_id"]] == [int(t) for t in a.tokens["token_id"]]
        logits = [(r.segment, r.shape) for r in b.records if r.name == "result_output"]
        assert logits == [("prefill.0", (3, 2, 96)), ("prefill.1", (3, 2, 96)), ("prefill.2", (3, 1, 96)), ("decode", (3, 1, 96))]
        prefill = np.concatenate([b.read_values(r)[2] for r in b.records if r.name == "result_output" and r.step == 0])
        shapes = {(r.name, r.kernel_id): r.shape for r in b.records if r.step == 0 and r.segment == "prefill.0"}
        events = {(int(e["batch"]), int(e["q_rows"]), int(e["kv_len"]), int(e["q_heads"])) for e in b.dispatch}
        first = [r for r in b.records if r.step == 0 and r.segment == "prefill.0"]
        keys = b.read_values(next(r for r in first if r.name == "cache_k_l0 (reshaped) (view) (written)"))
        rope = b.read_values(next(r for r in first if r.name == "Kcur-0" and r.kernel_id == "ROPE"))
    assert prefill.tobytes() == returned[0].tobytes()
    assert [x.shape for x in returned] == [x.shape for x in own] == [(5, 96), (1, 96)]
    assert shapes[("Qcur-0", "ROPE")] == (3, 2, 4, 32) and shapes[("kq-0", "MUL_MAT")] == (3, 4, 2, 256)
    assert shapes[("cache_k_l0 (reshaped) (view) (written)", "SET_ROWS")] == (3, 2, 64), "each sequence's cells, from its own cache stream"
    assert keys.tobytes() == rope.tobytes()
    assert events == {(3, 2, 256, 4), (3, 1, 256, 4)}


def test_an_f16_kv_cache_is_recorded_in_float16_and_named_in_provenance(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out, TokenSchedule(SCHEDULE.prompt), LlamaSettings(kv_type="f16"))
    with open_capture(out, check_in_child=False) as capture:
        cache = [r for r in capture.records if r.name.startswith("cache_k_l0")]
        assert cache and {r.dtype for r in cache} == {"float16"}
        assert capture.meta.provenance["parity_settings"]["kv_type"] == "f16"


def test_a_quantized_kv_cache_is_kept_as_ggml_blocks_the_reader_decodes(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out, TokenSchedule(SCHEDULE.prompt), LlamaSettings(kv_type="q8_0", flash_attn=True))
    assert validate_file(out, 2**31, 60).problems == []
    with open_capture(out, check_in_child=False) as capture:
        written = next(r for r in capture.records if r.name == "cache_k_l0 (view) (written)")
        assert (written.dtype, written.shape) == ("q8_0", (len(SCHEDULE.prompt), 64))
        keys = capture.read_values(written)
        rope = next(r for r in capture.records if r.name == "Kcur-0" and r.kernel_id == "ROPE")
        k = capture.read_values(rope).reshape(len(SCHEDULE.prompt), -1)
    assert np.allclose(keys, k, atol=np.abs(k).max() / 100) and not np.array_equal(keys, k)


def test_a_quantized_v_cache_without_flash_attention_is_refused_by_llama_cpp(ggufs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(RecorderError, match="quantized V cache requires flash_attn to be enabled"):
        _record(ggufs["f32"], tmp_path / "x.h5", TokenSchedule(SCHEDULE.prompt), LlamaSettings(kv_type="q8_0"))
    assert not (tmp_path / "x.h5").exists()


K_WRITE, V_WRITE = "cache_k_l0 (view) (written)", "cache_v_l0 (reshaped) (view) (written)"


def test_each_step_records_the_cache_cells_it_wrote_once_and_bit_for_bit(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f32"], out, TokenSchedule(SCHEDULE.prompt, decode_steps=2, ubatch=2))
    with open_capture(out, check_in_child=False) as capture:
        records = capture.records
        assert not [r.name for r in records if r.name.startswith("cache_") and not r.name.endswith("(written)")], "no view of the whole cache"
        graphs = sorted({(r.step, r.segment) for r in records})
        for step, segment in graphs:
            def values(name: str, op: str) -> np.ndarray:
                (record,) = [r for r in records if (r.step, r.segment, r.name, r.kernel_id) == (step, segment, name, op)]
                return capture.read_values(record)
            keys, rope = values(K_WRITE, "SET_ROWS"), values("Kcur-0", "ROPE")
            assert keys.tobytes() == rope.tobytes() and keys.shape == (rope.shape[0], 64), (step, segment)
            assert values(V_WRITE, "SET_ROWS").tobytes() == values("Vcur-0", "MUL_MAT").tobytes(), "the transposed V cache, token by token"
        positions = [(r.position, r.shape[0]) for r in records if r.name == K_WRITE]
    assert graphs == [(0, "prefill.0"), (0, "prefill.1"), (0, "prefill.2"), (1, "decode"), (2, "decode")]
    assert positions == [(0, 2), (2, 2), (4, 1), (5, 1), (6, 1)], "every position written once, in order"


def test_with_flash_attention_the_cache_cast_for_the_kernel_is_left_out_too(ggufs: dict[str, Path], tmp_path: Path) -> None:
    written, whole = tmp_path / "written.h5", tmp_path / "whole.h5"
    schedule = TokenSchedule(SCHEDULE.prompt, decode_steps=1)
    _record(ggufs["f32"], written, schedule, LlamaSettings(flash_attn=True))
    _record(ggufs["f32"], whole, schedule, LlamaSettings(flash_attn=True, whole_cache=True))
    with open_capture(written, check_in_child=False) as a, open_capture(whole, check_in_child=False) as b:
        cache = [{(r.name, r.kernel_id) for r in c.records if r.step == 1 and r.layer == 0 and r.name.startswith("cache_")} for c in (a, b)]
    assert cache[0] == {(K_WRITE, "SET_ROWS"), ("cache_v_l0 (view) (written)", "SET_ROWS")}, "not transposed with flash attention"
    assert ("cache_k_l0 (view) (permuted) (copy)", "CPY") in cache[1], "the whole cache cast to F16 for the kernel"


def test_the_whole_cache_setting_records_every_cell_and_holds_the_written_ones_where_they_were_written(
    ggufs: dict[str, Path], tmp_path: Path
) -> None:
    written, whole = tmp_path / "written.h5", tmp_path / "whole.h5"
    schedule = TokenSchedule(SCHEDULE.prompt, decode_steps=2)
    _record(ggufs["f32"], written, schedule)
    _record(ggufs["f32"], whole, schedule, LlamaSettings(whole_cache=True))
    with open_capture(written, check_in_child=False) as a, open_capture(whole, check_in_child=False) as b:
        views = {r.name for r in b.records if r.name.startswith("cache_k_l0")}
        assert views == {"cache_k_l0 (view)", "cache_k_l0 (view) (permuted)"}
        cache_bytes = [sum(r.nbytes for r in c.records if r.name.startswith("cache_")) for c in (a, b)]
        assert cache_bytes == [2 * 2 * 7 * 64 * 4, 3 * 2 * 7 * 256 * 64 * 4], "2 layers, K and V, 7 positions: once each, or 7 whole caches each step"
        for step in (0, 1, 2):
            def values(capture: Capture, name: str) -> tuple[np.ndarray, int]:
                (record,) = [r for r in capture.records if (r.step, r.name, r.kernel_id) == (step, name, "SET_ROWS")]
                return capture.read_values(record), record.position
            (keys, first), (cache_k, _) = values(a, K_WRITE), values(b, "cache_k_l0 (view)")
            (vals, _), (cache_v, _) = values(a, V_WRITE), values(b, "cache_v_l0 (reshaped) (view)")
            cells = slice(first, first + keys.shape[0])
            assert cache_k.shape == (256, 64) and keys.tobytes() == cache_k[cells].tobytes()
            assert cache_v.shape == (64 * 256, 1) and vals.tobytes() == np.ascontiguousarray(cache_v.reshape(64, 256)[:, cells].T).tobytes()
    assert a.meta.provenance["parity_settings"]["whole_cache"] is False and b.meta.provenance["parity_settings"]["whole_cache"] is True


def test_all_nodes_adds_the_unnamed_nodes_and_two_such_runs_are_parity(ggufs: dict[str, Path], tmp_path: Path) -> None:
    """Two identical --all-nodes runs read DIVERGENCE: the last layer's GET_ROWS over out_ids
    (the rows whose logits are computed) had no rule, and `no_rule` is a finding."""
    from sessions.compare.comparison import iter_compare
    from sessions.progress import run_to_end

    named, every, again = tmp_path / "named.h5", tmp_path / "all.h5", tmp_path / "again.h5"
    schedule = TokenSchedule(SCHEDULE.prompt, decode_steps=1)
    _record(ggufs["f32"], named, schedule)
    _record(ggufs["f32"], every, schedule, LlamaSettings(all_nodes=True))
    _record(ggufs["f32"], again, schedule, LlamaSettings(all_nodes=True))
    with open_capture(named, check_in_child=False) as a, open_capture(every, check_in_child=False) as b:
        assert len(b.records) >= len(a.records)
        assert {r.name for r in a.records} <= {r.name for r in b.records}
    with open_capture(every, check_in_child=False) as b, open_capture(again, check_in_child=False) as c:
        comparison = run_to_end(iter_compare(b, c))
    assert comparison.verdict.word == "PARITY"
    selections = [u for u in comparison.unaligned if u.detail.startswith("the last layer's rows whose logits are computed")]
    assert {u.reason for u in selections} == {"one_sided"} and {u.step for u in selections} == {0, 1}
    assert len(selections) == 8, "two GET_ROWS over out_ids a step, on each side"


def test_a_missing_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecorderError, match="no such GGUF file"):
        _record(tmp_path / "absent.gguf", tmp_path / "x.h5")


@pytest.mark.parametrize(("extra_bufts", "declined"), [(True, {"declined": {"CPU_REPACK": 25}}), (False, {})])
def test_provenance_keeps_the_build_and_the_buffer_types_that_ran(ggufs: dict[str, Path], tmp_path: Path, extra_bufts: bool, declined: dict[str, object]) -> None:
    import llama_cpp

    out = tmp_path / "llama.h5"
    _record(ggufs["q8_0"], out, TokenSchedule(SCHEDULE.prompt), LlamaSettings(extra_bufts=extra_bufts))
    with open_capture(out, check_in_child=False) as capture:
        provenance = capture.meta.provenance
    assert provenance["system_info"] == llama_cpp.llama_print_system_info().decode().strip()
    assert provenance["parity_settings"]["extra_bufts"] is extra_bufts
    user_set = any(name in os.environ for name in OPENMP_WAIT)
    assert provenance["openmp_wait"] == ({name: os.environ.get(name, "") for name in OPENMP_WAIT} if user_set else OPENMP_WAIT)
    # This build's repacking buffer type declines all 25 of the tiny q8_0 model's weights: they stay in the mapped file.
    assert provenance["buffer_types"] == {"model": ["CPU_Mapped"], "KV": ["CPU"], "compute": ["CPU"], "output": ["CPU"], **declined}


def test_provenance_carries_the_models_config_from_the_gguf_under_config_json_names(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "llama.h5"
    _record(ggufs["f16"], out, TokenSchedule(SCHEDULE.prompt))
    with open_capture(out, check_in_child=False) as capture:
        config = capture.meta.provenance["config"]
    # The GGUF stores eps as float32: the config keeps that value, the one llama.cpp ran with.
    assert config["rms_norm_eps"] == float(np.float32(TINY.rms_norm_eps)) and config["rope_theta"] == TINY.rope_theta
    assert {k: config[k] for k in ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")} == {
        "model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    }


def test_each_flash_attention_gets_one_dispatch_event_on_its_kqv_out_over_the_padded_cache(ggufs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "flash.h5"
    _record(ggufs["f32"], out, settings=LlamaSettings(flash_attn=True))
    with open_capture(out, check_in_child=False) as capture:
        events = capture.dispatch
        assert [capture.records[seq].name for seq in events["index_seq"].tolist()] == ["kqv_out-0", "kqv_out-1"] * 3
        assert {cf.decode_field(p) for p in events["primitive"].tolist()} == {"flash_attn_ext"}
        assert {cf.decode_field(m) for m in events["mask_kind"].tolist()} == {"causal"}
        assert events["q_rows"].tolist() == [5, 5, 1, 1, 1, 1] and set(events["kv_len"].tolist()) == {256}
        assert (int(events["q_heads"][0]), int(events["kv_heads"][0]), int(events["head_dim"][0])) == (4, 2, 32)
        assert capture.meta.provenance["threads"] == LlamaSettings().n_threads


def test_openmp_workers_spin_briefly_unless_the_environment_says_how_they_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OPENMP_WAIT:
        monkeypatch.setenv(name, "set")  # so that monkeypatch puts back what was there, set or not
        monkeypatch.delenv(name)
    brief_openmp_wait()
    assert {name: os.environ[name] for name in OPENMP_WAIT} == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    brief_openmp_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in os.environ, "a user's policy gets no spin count beside it"


@pytest.mark.parametrize("schedule", [TokenSchedule((5,), decode_steps=1), TokenSchedule(SCHEDULE.prompt, decode_steps=1, ubatch=1)], ids=["one-token prompt", "ubatch 1"])
def test_a_run_of_one_row_calls_only_keeps_every_nodes_row_axis(ggufs: dict[str, Path], tmp_path: Path, schedule: TokenSchedule) -> None:
    reference, one_row = tmp_path / "reference.h5", tmp_path / "one-row.h5"
    _record(ggufs["f32"], reference)
    _record(ggufs["f32"], one_row, schedule)
    with open_capture(reference, check_in_child=False) as capture:
        decode_shapes = {(r.name, r.kernel_id, r.occurrence): r.shape for r in capture.records if r.step == 1}
    with open_capture(one_row, check_in_child=False) as capture:
        shapes = {(r.name, r.kernel_id, r.occurrence): r.shape for r in capture.records}
        embd = [r.shape for r in capture.records if r.name == "embd"]
    assert embd and set(embd) == {(1, 64)}
    assert {key: shapes[key] for key in decode_shapes} == decode_shapes

"""Alignment by (step, segment, layer, canonical op, occurrence); nothing dropped, nothing guessed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter
from sessions.compare.align import CUT_HINT, AlignedPairs, ManualPair, align
from sessions.compare.comparison import iter_compare, resolve_profiles
from sessions.compare.key import RecordKey
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import (
    ProfileError,
    builtin_profiles,
    load_profile_file,
    profile_from_dict,
)
from sessions.compare.unaligned import (
    DUPLICATE_KEY,
    LAYER_CONFLICT,
    NO_PARTNER,
    NO_RULE,
    ONE_SIDED,
    SHAPE_MISMATCH,
)
from sessions.compare.verdict import PARITY
from sessions.progress import run_to_end

ROWS, HEADS, DIM = 3, 2, 4


def _q(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return bf16_bits(np.random.default_rng(seed).standard_normal(shape))


def _align(native: Path, oracle: Path, native_profile: str, oracle_profile: str):  # type: ignore[no-untyped-def]
    profiles = builtin_profiles()
    with open_capture(native) as n, open_capture(oracle) as o:
        return align(n.records, o.records, profiles[native_profile], profiles[oracle_profile])


def _llama_q_stages(with_norm: bool) -> list[T]:
    proj = T("Qcur-0", _q(1, (ROWS, HEADS * DIM)), layer=0, dtype="bfloat16")
    norm = T("Qcur-0", _q(2, (ROWS, HEADS, DIM)), layer=0, dtype="bfloat16")
    rope = T("Qcur-0", _q(3, (ROWS, HEADS, DIM)), layer=0, dtype="bfloat16")
    return [proj, norm, rope] if with_norm else [proj, rope]


def _canonical_q_stages(with_norm: bool) -> list[T]:
    stages = [T("q_proj", _q(1, (ROWS, HEADS * DIM)), layer=0, dtype="bfloat16")]
    if with_norm:
        stages.append(T("q_norm", _q(2, (ROWS, HEADS, DIM)).transpose(1, 0, 2).copy(), layer=0, dtype="bfloat16"))
    stages.append(T("q_rope", _q(3, (ROWS, HEADS, DIM)).transpose(1, 0, 2).copy(), layer=0, dtype="bfloat16"))
    return stages


def test_occurrence_rule_with_a_norm_stage_pairs_projection_norm_and_rope(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "n.h5", "native", _llama_q_stages(True))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _canonical_q_stages(True))
    alignment = _align(native, oracle, "llama.cpp", "canonical")
    assert [(p.key.op, p.native.record.occurrence) for p in alignment.pairs] == [("q_proj", 0), ("q_norm", 1), ("q_rope", 2)]
    assert alignment.unaligned == []
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    assert [p.metrics.bit_exact for p in comparison.pairs] == [True, True, True]


def test_occurrence_rule_without_a_norm_stage_makes_the_second_occurrence_post_rope(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "n.h5", "native", _llama_q_stages(False))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _canonical_q_stages(False))
    alignment = _align(native, oracle, "llama.cpp", "canonical")
    assert [(p.key.op, p.native.record.occurrence) for p in alignment.pairs] == [("q_proj", 0), ("q_rope", 1)]
    assert alignment.unaligned == []


def test_layout_transform_aligns_mlx_sdpa_output_with_llama_kqv_out(tmp_path: Path) -> None:
    heads_rows_dim = _q(4, (HEADS, ROWS, DIM))
    merged = heads_rows_dim.transpose(1, 0, 2).reshape(ROWS, HEADS * DIM).copy()
    native = write_capture(tmp_path / "n.h5", "native", [T("kqv_out-0", merged, layer=0, dtype="bfloat16")])
    oracle = write_capture(
        tmp_path / "o.h5", "oracle", [T("model.layers.0.self_attn.sdpa", heads_rows_dim[None].copy(), layer=0, dtype="bfloat16")]
    )
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    assert len(comparison.pairs) == 1 and comparison.pairs[0].metrics.bit_exact
    assert comparison.pairs[0].metrics.shape == [ROWS, HEADS * DIM]
    assert comparison.verdict.word == PARITY


def test_duplicate_key_is_an_error_for_every_claimant_and_the_partner(tmp_path: Path) -> None:
    profile = tmp_path / "dup.toml"
    profile.write_text('name = "dup"\n[[rule]]\nname = "a-{layer}"\nop = "layer_out"\n[[rule]]\nname = "b-{layer}"\nop = "layer_out"\n')
    x = _q(5, (ROWS, 8))
    native = write_capture(tmp_path / "n.h5", "native", [T("a-0", x, layer=0, dtype="bfloat16"), T("b-0", x, layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")])
    with open_capture(native) as n, open_capture(oracle) as o:
        alignment = align(n.records, o.records, load_profile_file(profile), builtin_profiles()["canonical"])
    assert alignment.pairs == []
    assert sorted((u.side, u.name, u.reason) for u in alignment.unaligned) == [
        ("native", "a-0", DUPLICATE_KEY),
        ("native", "b-0", DUPLICATE_KEY),
        ("oracle", "layer_out", DUPLICATE_KEY),
    ]


def test_keys_pair_across_sides_whose_segments_and_ops_are_named_in_another_order_and_each_duplicate_says_why(tmp_path: Path) -> None:
    profile = tmp_path / "dup.toml"
    profile.write_text('name = "dup"\n[[rule]]\nname = "a-{layer}"\nop = "layer_out"\n[[rule]]\nname = "b-{layer}"\nop = "layer_out"\n[[rule]]\nname = "n-{layer}"\nop = "attn_norm"\n')
    x = _q(8, (ROWS, 8))

    def records(*named: tuple[str, str, int]) -> list[T]:
        return [T(name, x, segment=segment, layer=layer, dtype="bfloat16") for name, segment, layer in named]

    native = write_capture(
        tmp_path / "n.h5",
        "native",
        records(("n-0", "visual", 0), ("a-0", "visual", 0), ("b-0", "visual", 0), ("n-0", "text", 0), ("a-1", "text", 1), ("a-2", "text", 2)),
    )
    oracle = write_capture(tmp_path / "o.h5", "oracle", records(("a-2", "text", 2), ("b-2", "text", 2), ("n-0", "text", 0), ("a-0", "visual", 0), ("n-0", "visual", 0)))
    with open_capture(native) as n, open_capture(oracle) as o:
        alignment = align(n.records, o.records, load_profile_file(profile), load_profile_file(profile), mode="calls")
    assert [(p.key.text(), p.native.record.seq, p.oracle.record.seq) for p in alignment.pairs] == [
        ("0:visual:0:attn_norm", 0, 4),
        ("0:text:0:attn_norm", 3, 2),
    ]
    assert [(u.side, u.seq, u.reason, u.detail) for u in alignment.unaligned] == [
        ("native", 1, DUPLICATE_KEY, "step 0 visual layer 0 layer_out is claimed by 'a-0' (seq 1), 'b-0' (seq 2)"),
        ("native", 2, DUPLICATE_KEY, "step 0 visual layer 0 layer_out is claimed by 'a-0' (seq 1), 'b-0' (seq 2)"),
        ("native", 4, NO_PARTNER, "no oracle record for step 0 text layer 1 layer_out" + CUT_HINT),
        ("native", 5, DUPLICATE_KEY, "its partner key step 0 text layer 2 layer_out is ambiguous on the oracle side"),
        ("oracle", 0, DUPLICATE_KEY, "step 0 text layer 2 layer_out is claimed by 'a-2' (seq 0), 'b-2' (seq 1)"),
        ("oracle", 1, DUPLICATE_KEY, "step 0 text layer 2 layer_out is claimed by 'a-2' (seq 0), 'b-2' (seq 1)"),
        ("oracle", 3, DUPLICATE_KEY, "its partner key step 0 visual layer 0 layer_out is ambiguous on the native side"),
    ]


def test_records_without_partner_or_with_other_shapes_are_listed_with_reasons(tmp_path: Path) -> None:
    native = write_capture(
        tmp_path / "n.h5",
        "native",
        [T("attn_norm-0", _q(6, (ROWS, 8)), layer=0, dtype="bfloat16"), T("l_out-0", _q(7, (ROWS, 8)), layer=0, dtype="bfloat16")],
    )
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0", _q(7, (1, ROWS + 1, 8)), layer=0, dtype="bfloat16")])
    alignment = _align(native, oracle, "llama.cpp", "mlx-lm")
    reasons = sorted((u.side, u.name, u.reason) for u in alignment.unaligned)
    assert reasons == [
        ("native", "attn_norm-0", NO_PARTNER),
        ("native", "l_out-0", SHAPE_MISMATCH),
        ("oracle", "model.layers.0", SHAPE_MISMATCH),
    ]
    assert "native [3, 8] vs oracle [4, 8]" in alignment.unaligned[1].detail


def _llama_projections(path: Path, sources: dict[str, list[str]]) -> Path:
    """A llama.cpp-style capture: the unnamed MUL_MAT nodes the recorder keeps, with their `ggml_src`."""
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="llama.cpp", weights_hash="sha256:aa")) as writer:
        for seed, (name, names) in enumerate(sources.items()):
            writer.add_tensor(name, _q(20 + seed, (ROWS, 8)), step=0, segment="prefill", layer=0, dtype="bfloat16",
                              kernel_id="MUL_MAT", attrs={"ggml_src": json.dumps(names)})
    return path


def test_the_comparison_places_unnamed_nodes_by_their_source_weights_not_by_the_fallback(tmp_path: Path) -> None:
    native = _llama_projections(tmp_path / "n.h5", {
        "node_5": ["blk.0.attn_output.weight", "kqv_out-0"],
        "node_9": ["blk.0.ffn_down.weight", "ffn_swiglu-0"],
    })
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0.self_attn.o_proj", _q(20, (1, ROWS, 8)), layer=0, dtype="bfloat16")])
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(native_profile="llama.cpp", oracle_profile="mlx-lm")))
    assert [(p.key.op, p.native_name, p.metrics.bit_exact) for p in comparison.pairs] == [("o_proj", "node_5", True)]
    assert [(u.name, u.reason) for u in comparison.unaligned] == [("node_9", NO_RULE)]


def test_a_source_anchored_node_whose_weight_names_another_layer_is_a_conflict_not_a_pair(tmp_path: Path) -> None:
    native = _llama_projections(tmp_path / "n.h5", {"node_5": ["blk.1.attn_output.weight", "kqv_out-1"]})
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0.self_attn.o_proj", _q(20, (1, ROWS, 8)), layer=0, dtype="bfloat16")])
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(native_profile="llama.cpp", oracle_profile="mlx-lm")))
    assert comparison.pairs == []
    assert [(u.side, u.name, u.reason) for u in comparison.unaligned] == [("native", "node_5", LAYER_CONFLICT), ("oracle", "model.layers.0.self_attn.o_proj", NO_PARTNER)]


def test_the_fallback_output_projection_rule_serves_only_records_without_known_sources() -> None:
    llama = builtin_profiles()["llama.cpp"]
    fallback = llama.match("node_7", 0, 1, "MUL_MAT", ())
    assert fallback is not None and fallback.op == "o_proj"
    assert llama.match("node_7", 0, 1, "MUL_MAT", ("blk.3.ffn_down.weight", "ffn_swiglu-3")) is None
    anchored = llama.match("node_7", 0, 1, "MUL_MAT", ("blk.3.attn_output.weight", "kqv_out-3"))
    assert anchored is not None and (anchored.op, anchored.layer) == ("o_proj", 3)
    with pytest.raises(ProfileError, match="without_sources must be true or false"):
        profile_from_dict({"name": "p", "rule": [{"name": "x", "op": "embed", "without_sources": "yes"}]}, "p.toml")


def test_an_optional_stage_pairs_in_the_layers_the_other_capture_records_it_and_is_one_sided_elsewhere(tmp_path: Path) -> None:
    """An engine may record its KV cache in some layers only (mlx-lm keeps a rotating cache in
    sliding-window layers): the other layers' cells are one-sided, not missing partners."""
    cells = [T("k_cache", _q(10 + layer, (ROWS, HEADS * DIM)), layer=layer, dtype="bfloat16") for layer in (0, 1)]
    native = write_capture(tmp_path / "n.h5", "native", cells, [(0, 5, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", cells[:1], [(0, 5, False)])
    alignment = _align(native, oracle, "canonical", "canonical")
    assert [(p.key.layer, p.key.op) for p in alignment.pairs] == [(0, "k_cache")]
    assert [(u.side, u.layer, u.reason) for u in alignment.unaligned] == [("native", 1, ONE_SIDED)]


def test_a_manual_pairing_of_an_optional_stage_holds_where_the_other_capture_lacks_it(tmp_path: Path) -> None:
    """The user's pairing comes first: a record the other side has no op for is still theirs to pair."""
    native = write_capture(tmp_path / "n.h5", "native", [T("k_cache", _q(20, (ROWS, HEADS * DIM)), layer=0, dtype="bfloat16")], [(0, 5, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("k_proj", _q(20, (ROWS, HEADS * DIM)), layer=0, dtype="bfloat16")], [(0, 5, False)])
    override = ManualPair(RecordKey(0, "prefill", 0, "k_cache"), RecordKey(0, "prefill", 0, "k_proj"), "the cache holds the projection")
    profiles = builtin_profiles()
    with open_capture(native) as n, open_capture(oracle) as o:
        alignment = align(n.records, o.records, profiles["canonical"], profiles["canonical"], overrides=(override,))
    assert [(p.native.record.name, p.oracle.record.name, p.manual_reason) for p in alignment.pairs] == [("k_cache", "k_proj", "the cache holds the projection")]
    assert alignment.unaligned == []


@pytest.mark.parametrize("scenario", ["attention-contract", "head-chunk", "swiglu-order", "post-eos", "signed-zero"])
def test_pairing_a_captures_index_columns_gives_the_pairs_and_unaligned_records_pairing_its_records_gives(
    demo_pairs: dict[str, tuple[Path, Path]], scenario: str
) -> None:
    """A capture's records are paired on its index columns (a real run's 480,000 records built no
    object each); a list of records (a run cut to its first steps) is paired record by record."""
    with open_capture(demo_pairs[scenario][0]) as n, open_capture(demo_pairs[scenario][1]) as o:
        profiles = resolve_profiles(n, o, CompareOptions())
        by_columns = align(n.records, o.records, *profiles)
        by_records = align(list(n.records), list(o.records), *profiles)
    assert isinstance(by_columns.pairs, AlignedPairs) and isinstance(by_records.pairs, list)
    assert list(by_columns.pairs) == by_records.pairs and len(by_records.pairs) > 200
    assert (by_columns.unaligned, by_columns.mode) == (by_records.unaligned, by_records.mode)


def test_records_paired_by_hand_under_a_key_two_records_claim_get_keys_of_their_own(tmp_path: Path) -> None:
    """Both pairs took the claimed key: the report's first divergence named the second pair, and
    the window, finding pairs by key, went to the first, bit-exact one."""
    profile = tmp_path / "dup.toml"
    profile.write_text('name = "dup"\n[[rule]]\nname = "a-{layer}"\nop = "layer_out"\n[[rule]]\nname = "b-{layer}"\nop = "layer_out"\n')
    x, y = _q(5, (ROWS, 8)), _q(6, (ROWS, 8))
    flipped = y.copy()
    flipped.view(np.uint16)[0, 0] ^= 1
    native = write_capture(tmp_path / "n.h5", "native", [T("a-0", x, layer=0, dtype="bfloat16"), T("b-0", y, layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("a-0", x, layer=0, dtype="bfloat16"), T("b-0", flipped, layer=0, dtype="bfloat16")])
    by_hand = tuple(ManualPair(RecordKey(0, "prefill", 0, name), RecordKey(0, "prefill", 0, name), "one each") for name in ("a-0", "b-0"))
    options = CompareOptions(native_profile=str(profile), oracle_profile=str(profile), overrides=by_hand)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, options))
    assert [(p.key.text(), p.native_name, p.metrics.bit_exact) for p in comparison.pairs] == [
        ("0:prefill:0:layer_out", "a-0", True),
        ("0:prefill:0:layer_out#1", "b-0", False),
    ]
    assert comparison.verdict.first is not None and comparison.verdict.first.key.text() == "0:prefill:0:layer_out#1"

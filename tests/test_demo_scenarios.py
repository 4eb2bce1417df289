"""Each demo scenario diverges exactly where backends.engines.demo_scenarios says, and nowhere earlier.

The captures are read back with sessions.capture.reader and paired with the mapping below
(the canonical-op table of docs/architecture.md); bits are compared raw, never with `==` on
values, so signed zeros and NaN payloads count.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

from backends.demo.generate import iter_generate
from backends.engines.demo_model import load_weights, weights_hash
from backends.engines.demo_scenarios import EOS_DECODE_STEP, SCENARIOS, ExpectedVerdict
from backends.kernels import attention_contracts as contracts
from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture, Record
from sessions.compare.comparison import iter_compare
from sessions.compare.key import OpKey
from sessions.compare.verdict import (
    CONTRACT_MISMATCH,
    DISPATCH_ONLY,
    DIVERGENCE,
    PARITY,
    SIGNED_ZERO_ONLY,
    Kind,
)
from sessions.progress import run_to_end

Key = tuple[int, str, int, str, int]

ORACLE_OPS = {
    "model.embed_tokens": "embed",
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "q_proj",
    "self_attn.k_proj": "k_proj",
    "self_attn.v_proj": "v_proj",
    "self_attn.q_norm": "q_norm",
    "self_attn.k_norm": "k_norm",
    "self_attn.sdpa": "sdpa",
    "self_attn.o_proj": "o_proj",
    "attn_residual": "attn_residual",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.swiglu": "ffn_act",
    "mlp.down_proj": "ffn_down",
    "model.norm": "final_norm",
    "lm_head": "logits",
}
NATIVE_OPS = {
    "inp_embd": "embed",
    "attn_norm": "attn_norm",
    "Vcur": "v_proj",
    "Qcur_normed": "q_norm",
    "Kcur_normed": "k_norm",
    "kqv_out": "sdpa",
    "attn_out": "o_proj",
    "ffn_inp": "attn_residual",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "ffn_gate",
    "ffn_up": "ffn_up",
    "ffn_swiglu": "ffn_act",
    "ffn_out": "ffn_down",
    "l_out": "layer_out",
    "result_norm": "final_norm",
    "result_output": "logits",
}
HEAD_MAJOR = {"q_norm", "k_norm", "q_rope", "k_rope"}


def oracle_op(record: Record) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    name = re.sub(r"^model\.layers\.\d+\.?", "", record.name)
    if record.layer >= 0 and name == "":
        op = "layer_out"
    elif name == "self_attn.rope":
        op = "q_rope" if record.occurrence == 0 else "k_rope"
    else:
        op = ORACLE_OPS[name if record.layer >= 0 else record.name]
    if op in ("q_norm", "k_norm"):
        return op, lambda a: a[0].transpose(1, 0, 2)
    if op in ("q_rope", "k_rope"):
        return op, lambda a: a[0]
    if op == "sdpa":
        return op, lambda a: a[0].transpose(1, 0, 2).reshape(a.shape[2], -1)
    return op, lambda a: a[0]


def native_op(record: Record) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    base = record.name.rsplit("-", 1)[0] if record.layer >= 0 else record.name
    if base in ("Qcur", "Kcur"):
        prefix = base[0].lower()
        op = f"{prefix}_proj" if record.occurrence == 0 else f"{prefix}_rope"
    else:
        op = NATIVE_OPS[base]
    if op in HEAD_MAJOR:
        return op, lambda a: a.transpose(1, 0, 2)
    return op, lambda a: a


@dataclass
class Side:
    capture: Capture
    records: dict[Key, tuple[Record, Callable[[np.ndarray], np.ndarray]]]

    def bits(self, key: Key) -> np.ndarray:
        record, transform = self.records[key]
        return transform(self.capture.read_bits(record))

    def calls(self, key: Key) -> list[tuple]:
        seq = self.records[key][0].seq
        rows = self.capture.dispatch[self.capture.dispatch["index_seq"] == seq]
        fields = ("call", "kv_group", "head_start", "head_count", "q_rows", "kv_len", "head_dim", "mask_kind", "primitive", "metal_primitive")
        return [tuple(row[f] for f in fields) for row in rows]


def side(path: Path, mapping: Callable[[Record], tuple[str, Callable[[np.ndarray], np.ndarray]]]) -> Side:
    capture = open_capture(path)
    records = {}
    for record in capture.records:
        op, transform = mapping(record)
        occurrence = 0 if op in ("q_rope", "k_rope") else record.occurrence
        key = (record.step, record.segment, record.layer, op, occurrence)
        assert key not in records, f"{path.name}: {key} mapped twice"
        records[key] = (record, transform)
    return Side(capture, records)


def pair_kind(native: Side, oracle: Side, key: Key) -> str:
    n_rec, o_rec = native.records[key][0], oracle.records[key][0]
    if n_rec.effective_contract_id != o_rec.effective_contract_id:
        return "contract"
    a, b = native.bits(key), oracle.bits(key)
    assert a.shape == b.shape, f"{key}: canonical shapes {a.shape} and {b.shape}"
    differ = a != b
    if differ.any():
        zeros = (a[differ] & 0x7FFF) | (b[differ] & 0x7FFF)
        return "signed-zero-only" if not zeros.any() else "bits"
    if native.calls(key) != oracle.calls(key):
        return "dispatch-only"
    return "none"


def diverging_pairs(native: Side, oracle: Side) -> list[tuple[Key, str]]:
    """Every pair that differs, in oracle execution order, then records only one side has."""
    found = []
    for key, (record, _) in sorted(oracle.records.items(), key=lambda item: item[1][0].seq):
        if key not in native.records:
            found.append((key, "oracle-only"))
            continue
        kind = pair_kind(native, oracle, key)
        if kind != "none":
            found.append((key, kind))
    stops = oracle.capture.tokens[oracle.capture.tokens["is_stop"] == 1]
    eos_step = int(stops["step"][0]) if len(stops) else None
    for key, (record, _) in sorted(native.records.items(), key=lambda item: item[1][0].seq):
        if key not in oracle.records:
            kind = "post-eos-only" if eos_step is not None and record.step > eos_step else "native-only"
            found.append((key, kind))
    return found


HELD_OUT_KINDS = {"contract": Kind.CONTRACT_MISMATCH, "bits": Kind.DIVERGED, "signed-zero-only": Kind.SIGNED_ZERO_ONLY, "dispatch-only": Kind.DISPATCH_ONLY}
HELD_OUT_WORDS = (("contract", CONTRACT_MISMATCH), ("bits", DIVERGENCE), ("signed-zero-only", SIGNED_ZERO_ONLY), ("dispatch-only", DISPATCH_ONLY))


def as_expected(found: list[tuple[Key, str]]) -> ExpectedVerdict:
    """This reading's own verdict: records after the shared EOS are not failures; the word is
    the most serious kind found, the first finding the first failing pair."""
    failing = [(key, kind) for key, kind in found if kind != "post-eos-only"]
    if not failing:
        return ExpectedVerdict(PARITY)
    kinds = {kind for _, kind in failing}
    word = next(w for kind, w in HELD_OUT_WORDS if kind in kinds)
    (step, segment, layer, op, occurrence), kind = failing[0]
    return ExpectedVerdict(word, HELD_OUT_KINDS[kind], OpKey(step, segment, layer, op, occurrence))


def load_pair(pair: tuple[Path, Path]) -> tuple[Side, Side]:
    native_path, oracle_path = pair
    return side(native_path, native_op), side(oracle_path, oracle_op)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_first_divergence_is_where_the_scenario_documents_it(demo_pairs: dict, name: str) -> None:
    native, oracle = load_pair(demo_pairs[name])
    assert as_expected(diverging_pairs(native, oracle)) == SCENARIOS[name].expected


@pytest.mark.slow
def test_clean_pair_matches_bit_for_bit_on_every_record_and_dispatch_event(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["clean"])
    assert native.records.keys() == oracle.records.keys()
    assert len(oracle.records) == 333
    for key in oracle.records:
        assert np.array_equal(native.bits(key), oracle.bits(key)), key
        assert native.calls(key) == oracle.calls(key), key
    assert native.capture.tokens.tolist() == oracle.capture.tokens.tolist()


@pytest.mark.slow
def test_head_chunk_changes_only_the_text_after_dispatch_and_its_metal_route(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["head-chunk"])
    found = diverging_pairs(native, oracle)
    assert {kind for _, kind in found} == {"dispatch-only"}
    assert {key[1] for key, _ in found} == {"text-after"}
    key = (0, "text-after", 1, "sdpa", 0)
    assert [c[1:4] + c[8:] for c in oracle.calls(key)] == [
        (0, 0, 5, b"fallback", b"sdpa_vector"),
        (0, 5, 1, b"fallback", b"sdpa_vector"),
        (1, 6, 5, b"fallback", b"sdpa_vector"),
        (1, 11, 1, b"fallback", b"sdpa_vector"),
    ]
    assert [c[1:4] + c[8:] for c in native.calls(key)] == [(-1, 0, 12, b"fallback", b"fallback")]
    with open_capture(native.capture.path) as n, open_capture(oracle.capture.path) as o:
        difference = next(d for d in run_to_end(iter_compare(n, o)).dispatch_differences if d.key == OpKey(*key))
    assert difference.native_summary.startswith("1 call(s), heads per call 12 over all KV groups, 6 rows"), "an unchunked call read '12 per KV group'"
    assert difference.oracle_summary.startswith("4 call(s), heads per call 5+1 per KV group, 6 rows")


def test_a_dispatch_that_differs_in_a_field_the_summary_line_leaves_out_shows_that_field_on_both_lines(demo_pairs: dict, tmp_path: Path) -> None:
    """Two runs whose calls differed in `batch` alone printed two identical lines under "differs in batch"."""
    native, oracle = demo_pairs["clean"]
    batched = tmp_path / "batch2.oracle.h5"
    shutil.copyfile(oracle, batched)
    with h5py.File(batched, "r+") as f:
        table = f["dispatch"][:]
        table["batch"] = 2
        f["dispatch"][:] = table
    with open_capture(native) as n, open_capture(batched) as o:
        difference = run_to_end(iter_compare(n, o)).dispatch_differences[0]
    assert difference.fields == ["batch"]
    assert (difference.native_summary.split(", ")[-1], difference.oracle_summary.split(", ")[-1]) == ("batch 1", "batch 2")


@pytest.mark.slow
def test_attention_contract_switches_at_q64_and_the_bits_follow(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["attention-contract"])
    for segment, oracle_effective in (("text-before", contracts.SINGLE_RANGE), ("visual", contracts.TILED_64)):
        o_rec, n_rec = oracle.records[(0, segment, 0, "sdpa", 0)][0], native.records[(0, segment, 0, "sdpa", 0)][0]
        assert (o_rec.contract_id, o_rec.effective_contract_id) == (contracts.AUTO_QTILE64, oracle_effective)
        assert n_rec.effective_contract_id == contracts.SINGLE_RANGE
    visual = (0, "visual", 0, "sdpa", 0)
    assert (native.bits(visual) != oracle.bits(visual)).sum() > 1000
    assert np.array_equal(native.bits((0, "text-before", 1, "sdpa", 0)), oracle.bits((0, "text-before", 1, "sdpa", 0)))


@pytest.mark.slow
def test_swiglu_order_differs_in_bits_under_the_same_declared_contract(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["swiglu-order"])
    key = (0, "text-before", 0, "ffn_act", 0)
    assert native.records[key][0].contract_id == oracle.records[key][0].contract_id != ""
    assert np.array_equal(native.bits((0, "text-before", 0, "ffn_up", 0)), oracle.bits((0, "text-before", 0, "ffn_up", 0)))
    assert (native.bits(key) != oracle.bits(key)).sum() > 100


@pytest.mark.slow
def test_signed_zero_copy_flips_only_negative_zeros_and_nothing_downstream(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["signed-zero"])
    found = diverging_pairs(native, oracle)
    assert {key[3] for key, _ in found} == {"ffn_act"}
    assert {kind for _, kind in found} == {"signed-zero-only"}
    key = (0, "text-before", 0, "ffn_act", 0)
    oracle_bits, native_bits = oracle.bits(key), native.bits(key)
    negative_zeros = oracle_bits == 0x8000
    assert negative_zeros.sum() > 0
    assert (native_bits[negative_zeros] == 0x0000).all()
    assert np.array_equal(native_bits[~negative_zeros], oracle_bits[~negative_zeros])


@pytest.mark.slow
def test_post_eos_native_keeps_decoding_after_the_shared_eos(demo_pairs: dict) -> None:
    native, oracle = load_pair(demo_pairs["post-eos"])
    o_tokens, n_tokens = oracle.capture.tokens, native.capture.tokens
    eos = oracle.capture.meta.provenance["eos_token_id"]
    assert o_tokens["step"].tolist() == list(range(EOS_DECODE_STEP + 1))
    assert o_tokens["token_id"][-1] == n_tokens["token_id"][EOS_DECODE_STEP] == eos
    assert o_tokens["is_stop"].tolist() == [0] * EOS_DECODE_STEP + [1]
    assert len(n_tokens) > len(o_tokens)
    assert o_tokens.tolist() == n_tokens[: len(o_tokens)].tolist()
    assert {kind for _, kind in diverging_pairs(native, oracle)} == {"post-eos-only"}


@pytest.mark.slow
def test_weights_are_saved_for_reruns_with_the_hash_the_captures_record(demo_pairs: dict) -> None:
    native_path, oracle_path = demo_pairs["clean"]
    with open_capture(oracle_path) as oracle:
        meta = oracle.meta
    weights = load_weights(native_path.parent / meta.provenance["weights_file"])
    assert weights_hash(weights) == meta.weights_hash
    assert meta.provenance["scenario"] == "clean" and meta.provenance["options"]["head_chunk"] is True


@pytest.mark.slow
def test_generating_twice_from_one_seed_gives_identical_tensor_bits(demo_pairs: dict, tmp_path: Path) -> None:
    again = run_to_end(iter_generate(tmp_path, ["attention-contract"], seed=0))["attention-contract"]
    for first, second in zip(demo_pairs["attention-contract"], again):
        with open_capture(first) as a, open_capture(second) as b:
            assert [r.name for r in a.records] == [r.name for r in b.records]
            for ra, rb in zip(a.records, b.records):
                assert np.array_equal(a.read_bits(ra), b.read_bits(rb)), ra.name
            assert a.tokens.tolist() == b.tokens.tolist()

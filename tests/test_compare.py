"""The whole comparison: demo scenarios, streaming in chunks, cancellation and the sidecar cache."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter
from sessions.compare.comparison import iter_compare
from sessions.compare.document import dumps, loads, loads_lines
from sessions.compare.key import OpKey
from sessions.compare.options import CompareOptions
from sessions.compare.profile_identity import ProfileIdentity, profile_content_hash
from sessions.compare.profiles import (
    BUILTIN_DIR,
    BUILTIN_FILES,
    builtin_profiles,
    load_profile_file,
)
from sessions.compare.result_cache import iter_compare_cached, iter_document_cached
from sessions.compare.verdict import PARITY
from sessions.progress import run_to_end


def _pair(tmp_path: Path, flip: tuple[int, int] = (50, 3)) -> tuple[Path, Path]:
    rng = np.random.default_rng(1)
    native = bf16_bits(rng.standard_normal((64, 4, 8)))
    oracle = native.copy()
    oracle[flip[0], 1, flip[1]] ^= 1
    merged = native.reshape(64, 32)
    call = dict(kv_group=0, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=64, kv_len=64, head_dim=8, primitive="fallback")
    n = write_capture(tmp_path / "n.h5", "native", [T("kqv_out-0", merged, layer=0, dtype="bfloat16", dispatch=[call])])
    o = write_capture(
        tmp_path / "o.h5",
        "oracle",
        [T("model.layers.0.self_attn.sdpa", oracle.transpose(1, 0, 2)[None].copy(), layer=0, dtype="bfloat16", dispatch=[call])],
    )
    return n, o


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["clean", "head-chunk", "attention-contract", "swiglu-order", "signed-zero", "post-eos"])
def test_the_verdict_names_each_demo_scenarios_documented_word_kind_and_key(
    demo_pairs: dict[str, tuple[Path, Path]], scenario: str
) -> None:
    from backends.demo.generate import SCENARIOS

    native, oracle = demo_pairs[scenario]
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    expected = SCENARIOS[scenario].expected
    first = comparison.verdict.first
    assert comparison.verdict.word == expected.word
    found = (None, None) if first is None else (first.kind, first.key)
    assert found == (expected.kind, expected.key)
    if expected.word == PARITY:
        assert comparison.unaligned == [] and all(p.metrics.bit_exact for p in comparison.pairs if not p.post_eos)


def test_chunked_streaming_through_a_layout_transform_matches_a_whole_read(tmp_path: Path) -> None:
    native, oracle = _pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        whole = run_to_end(iter_compare(n, o)).pairs[0].metrics
        chunked = run_to_end(iter_compare(n, o, CompareOptions(chunk_bytes=7 * 64))).pairs[0].metrics
    assert chunked.nmse == pytest.approx(whole.nmse, rel=1e-6)
    chunked.nmse, chunked.cosine = whole.nmse, whole.cosine
    assert chunked == whole
    assert whole.differing == 1 and whole.first_difference is not None and whole.first_difference.coord == [50, 8 + 3]
    assert whole.per_head is not None and whole.per_head.differing == [0, 1, 0, 0]


def test_progress_counts_bytes_up_to_the_total_and_closing_cancels(tmp_path: Path) -> None:
    native, oracle = _pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        work = iter_compare(n, o, CompareOptions(chunk_bytes=512))
        seen = [next(work) for _ in range(4)]
        work.close()
        with pytest.raises(StopIteration):
            next(work)
        done = [p.done for p in iter_compare(n, o, CompareOptions(chunk_bytes=512))]
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert done == sorted(done) and done[-1] == 2 * 64 * 32 * 2


def test_second_comparison_of_the_same_pair_comes_from_the_cache_and_a_change_invalidates(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    captures.mkdir()
    native, oracle = _pair(captures)
    cache = tmp_path / "cache"
    before = sorted(p.name for p in captures.iterdir())
    with open_capture(native) as n, open_capture(oracle) as o:
        first = run_to_end(iter_compare_cached(n, o, CompareOptions(), cache))
        labels = [p.label for p in iter_compare_cached(n, o, CompareOptions(), cache)]
        assert labels == ["cached result"]
        assert run_to_end(iter_compare_cached(n, o, CompareOptions(), cache)) == first
        other_options = [p.label for p in iter_compare_cached(n, o, CompareOptions(max_ulp=1), cache)]
        assert other_options != ["cached result"]
    assert sorted(p.name for p in captures.iterdir()) == before
    _pair(captures, flip=(10, 1))
    with open_capture(native) as n, open_capture(oracle) as o:
        fresh = run_to_end(iter_compare_cached(n, o, CompareOptions(), cache))
    assert fresh.pairs[0].metrics.first_difference is not None
    assert fresh.pairs[0].metrics.first_difference.coord == [10, 9]


def test_a_cached_result_names_the_captures_by_the_paths_given_now_not_by_those_of_the_run_that_filled_it(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    captures.mkdir()
    native, oracle = _pair(captures)
    (tmp_path / "link").symlink_to(captures, target_is_directory=True)
    cache = tmp_path / "cache"
    with open_capture(native) as n, open_capture(oracle) as o:
        first = run_to_end(iter_compare_cached(n, o, CompareOptions(), cache))
    linked = tmp_path / "link" / native.name, tmp_path / "link" / oracle.name
    with open_capture(linked[0]) as n, open_capture(linked[1]) as o:
        assert [p.label for p in iter_compare_cached(n, o, CompareOptions(), cache)] == ["cached result"]
        again = run_to_end(iter_compare_cached(n, o, CompareOptions(), cache))
        document = loads_lines(run_to_end(iter_document_cached(n, o, CompareOptions(), cache)))
    assert (first.native_path, first.oracle_path) == (str(native), str(oracle))
    assert (again.native_path, again.oracle_path) == (document.native_path, document.oracle_path) == tuple(map(str, linked))
    assert dataclasses.replace(again, native_path=first.native_path, oracle_path=first.oracle_path) == first
    assert dumps(document) == dumps(again)


def test_quantized_blocks_compare_as_bytes_beside_a_streamed_identical_pair(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    residual = bf16_bits(rng.standard_normal((64, 32)))
    blocks = rng.integers(0, 256, size=8 * 34, dtype=np.uint8)  # eight Q8_0 blocks of 32 weights: logical [4, 64]
    paths = []
    for role in ("native", "oracle"):
        writer = CaptureWriter(tmp_path / f"{role}.h5", CaptureMeta(role=role, engine_name=f"hand-{role}", weights_hash="sha256:aa"))
        writer.add_tensor("layer_out", residual, step=0, segment="prefill", layer=0, dtype="bfloat16")
        stored = blocks.copy()
        if role == "oracle":
            stored[100] ^= 0x10
        writer.add_tensor("ffn_down", stored, step=0, segment="prefill", layer=0, dtype="q8_0", logical_shape=(4, 64))
        writer.end_step()
        writer.close()
        paths.append(tmp_path / f"{role}.h5")
    with open_capture(paths[0]) as n, open_capture(paths[1]) as o:
        pairs = {p.key.op: p.metrics for p in run_to_end(iter_compare(n, o, CompareOptions(chunk_bytes=512))).pairs}
    assert pairs["layer_out"].bit_exact and (pairs["layer_out"].nmse, pairs["layer_out"].cosine) == (0.0, 1.0)
    quantized = pairs["ffn_down"]
    assert (quantized.differing, quantized.beyond_tolerance) == (1, 1)
    assert quantized.first_difference is not None and quantized.first_difference.coord == [100]
    assert quantized.first_difference.native_hex == f"0x{int(blocks[100]):02x}"
    assert (quantized.shape, quantized.size, quantized.unit) == ([272], 272, "bytes"), "counted over the stored bytes, not the 256 weights"
    with open_capture(paths[0]) as n, open_capture(paths[1]) as o:
        everything = run_to_end(iter_compare(n, o, CompareOptions(chunk_bytes=512)))
    assert everything.verdict.first is not None and everything.verdict.first.detail == "1 of 272 bytes differ"
    from sessions.report.text import render

    assert "max abs error 0 (quantized blocks are compared as bytes, not values)" in render(everything)


ORACLE_PROFILE = """name = "my-mlx"
# the sdpa output as mlx-lm stores it
[[rule]]
name = "model.layers.{layer}.self_attn.sdpa"
op = "sdpa"
layout = "1 heads rows dim -> rows (heads dim)"
"""


def test_each_pair_names_its_records_and_layouts_and_the_json_round_trip_keeps_them(tmp_path: Path) -> None:
    native, oracle = _pair(tmp_path)
    profile = tmp_path / "my-mlx.toml"
    profile.write_text(ORACLE_PROFILE, encoding="utf-8")
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(oracle_profile=str(profile))))
    (pair,) = comparison.pairs
    assert (pair.native_seq, pair.native_layout) == (0, None)
    assert (pair.oracle_seq, pair.oracle_layout) == (0, "1 heads rows dim -> rows (heads dim)")
    assert comparison.native_profile_identity == ProfileIdentity(
        "llama.cpp", str(BUILTIN_DIR / BUILTIN_FILES["llama.cpp"]), profile_content_hash(builtin_profiles()["llama.cpp"])
    )
    assert comparison.oracle_profile_identity == ProfileIdentity("my-mlx", str(profile.resolve()), profile_content_hash(load_profile_file(profile)))
    assert loads(dumps(comparison)) == comparison


def test_a_profile_edit_invalidates_the_cached_result_and_a_comment_does_not(tmp_path: Path) -> None:
    native, oracle = _pair(tmp_path)
    profile, cache = tmp_path / "my-mlx.toml", tmp_path / "cache"
    profile.write_text(ORACLE_PROFILE, encoding="utf-8")
    options = CompareOptions(oracle_profile=str(profile))
    with open_capture(native) as n, open_capture(oracle) as o:
        first = run_to_end(iter_compare_cached(n, o, options, cache))
        assert [p.label for p in iter_compare_cached(n, o, options, cache)] == ["cached result"]
        profile.write_text(ORACLE_PROFILE + "# a comment changes nothing the comparison uses\n", encoding="utf-8")
        assert [p.label for p in iter_compare_cached(n, o, options, cache)] == ["cached result"]
        profile.write_text(ORACLE_PROFILE.replace('op = "sdpa"', 'op = "q_proj"'), encoding="utf-8")
        edited = run_to_end(iter_compare_cached(n, o, options, cache))
    assert [p.key.op for p in first.pairs] == ["sdpa"] and edited.pairs == []
    assert sorted((u.side, u.reason) for u in edited.unaligned) == [("native", "no_partner"), ("oracle", "no_partner")]
    assert edited.oracle_profile_identity.path == first.oracle_profile_identity.path
    assert edited.oracle_profile_identity.sha256 != first.oracle_profile_identity.sha256


def test_bit_identical_records_get_exactly_the_metrics_the_diff_engine_gives_them(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """Identical small records are settled from their stored bytes (two preads) instead of the
    diff engine; what they get must be what a full pass over the same tensors gives."""
    from sessions.compare.align import align
    from sessions.compare.comparison import resolve_profiles
    from sessions.compare.pair_reader import PairReader
    from sessions.compare.tensor_diff import DiffAccumulator

    native_path, _ = demo_pairs["swiglu-order"]
    options = CompareOptions()
    with open_capture(native_path) as n, open_capture(native_path) as again:
        comparison = run_to_end(iter_compare(n, again, options))
        profile, _ = resolve_profiles(n, again, options)
        pairs = {p.key: p for p in align(list(n.records), list(again.records), profile, profile).pairs}
        assert len(comparison.pairs) == len(pairs) > 100
        reader = PairReader(n, again)
        for result in comparison.pairs:
            pair = pairs[result.key]
            reader.use(pair)
            logical = pair.native.record.dtype
            full = DiffAccumulator(logical, pair.native.shape, options.tolerance_for(pair.key, logical))
            full.add(reader.native.whole(), reader.oracle.whole())
            assert result.metrics == full.finish(), result.key


def test_the_document_in_lines_reads_back_to_the_same_comparison_and_a_broken_line_is_named(tmp_path: Path) -> None:
    from sessions.compare.document import ReportFormatError, document_lines, loads_lines

    native, oracle = _pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    lines = list(document_lines(comparison))
    kinds = [line.split("\t")[0] for line in lines[1:]]
    assert [k for k in kinds if k != "metrics"] == ["pairs"] * len(comparison.pairs), "error growth is derived from the pairs, not written"
    assert comparison.error_growth and loads_lines(("\n".join(lines) + "\n").encode()).error_growth == comparison.error_growth
    assert kinds[0] == "metrics" and kinds.count("metrics") == len({id(p.metrics) for p in comparison.pairs})
    assert dumps(loads_lines(("\n".join(lines) + "\n").encode())) == dumps(comparison)
    assert dumps(loads_lines(b"result\n" + "\n".join(lines).encode(), start=len(b"result\n"))) == dumps(comparison), "read from where it starts"
    with pytest.raises(ReportFormatError, match="an item of pairs is not JSON"):
        loads_lines("\n".join([lines[0], "pairs\t{broken"]).encode())
    with pytest.raises(ReportFormatError, match="a pair is a row of 14 values"):
        loads_lines("\n".join([lines[0], lines[1], "pairs\t[1, 2]"]).encode())
    with pytest.raises(ReportFormatError, match="metrics are the number of a metrics line"):
        loads_lines("\n".join([lines[0], lines[1], lines[2].replace(", 0, false,", ", -1, false,", 1)]).encode())
    with pytest.raises(ReportFormatError, match="an item of pairs is not JSON"):
        loads_lines(lines[0].encode() + b"\npairs\t\xff\xfe")
    with pytest.raises(ReportFormatError, match="names no list of it"):
        loads_lines("\n".join([lines[0], "verdict\t{}"]).encode())
    first_pair = next(line for line in lines if line.startswith("pairs\t"))
    with pytest.raises(ReportFormatError, match="IndexError in an item of pairs"):
        loads_lines("\n".join([lines[0], first_pair]).encode())


def test_a_pair_with_positions_windows_a_manual_reason_and_layouts_reads_back_from_its_document_line(tmp_path: Path) -> None:
    """A pair's line holds its values as JSON writes them, its key as text: every kind of value
    a pair can hold (a positioned key with an occurrence, windows, layouts, a user's reason with
    quotes, a tab and non-ASCII text, a verdict) comes back equal."""
    from sessions.compare.document import document_lines
    from sessions.compare.verdict import Kind

    native, oracle = _pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    first = comparison.pairs[0]
    odd = dataclasses.replace(
        first,
        key=first.key._replace(occurrence=2, positions=(5, 9)),
        native_layout="transpose(1,0)",
        manual_reason='paired by hand: "q" \u2260 k\tβ',
        native_window=(5, 9),
        oracle_window=(0, 4),
        verdict=Kind.WITHIN_TOLERANCE,
        within_tolerance=True,
    )
    comparison = dataclasses.replace(comparison, pairs=[odd, *comparison.pairs[1:]])
    line = next(line for line in document_lines(comparison) if line.startswith("pairs\t"))
    assert line.startswith(f'pairs\t["{first.key.text().split("@")[0]}#2@5-8", ')
    back = loads_lines(("\n".join(document_lines(comparison)) + "\n").encode())
    assert back.pairs[0] == odd and back.pairs[1:] == comparison.pairs[1:]


def test_a_document_line_with_a_null_key_extra_data_deep_nesting_or_an_unknown_verdict_is_named_not_a_crash(tmp_path: Path) -> None:
    """A damaged cache entry (or a child's garbled output) is refused as ReportFormatError, which
    the cache answers by comparing again; a null key was an AttributeError that ended `report`
    with a traceback."""
    from sessions.compare.document import ReportFormatError, document_lines, loads_lines

    native, oracle = _pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        lines = list(document_lines(run_to_end(iter_compare(n, o))))
    at = next(i for i, line in enumerate(lines) if line.startswith("pairs\t"))
    head = lines[: at + 1]
    pair = lines[at]
    row = json.loads(pair.split("\t", 1)[1])

    def changed(at: int, value: object) -> str:
        return "pairs\t" + json.dumps([value if i == at else v for i, v in enumerate(row)])

    assert changed(0, row[0]) == pair, "rows are written as json writes them"
    damaged = {
        "TypeError in an item of pairs: an op key is text": changed(0, None),
        "extra data at character": pair + " []",
        "ValueError in an item of pairs: 'identical' is not a valid Kind": changed(10, "identical"),
        "ValueError in an item of pairs: a pair's seqs are integers, not 1.5 and 0": changed(2, 1.5),
        "ValueError in an item of pairs: a pair's seqs are integers, not 0 and True": changed(4, True),
        "an item of pairs is not JSON \\(it nests deeper than a reader follows\\)": "pairs\t" + "[" * 100_000,
        "an item of pairs is not JSON \\(Exceeds the limit": "pairs\t" + "9" * 5000,
    }
    for problem, line in damaged.items():
        with pytest.raises(ReportFormatError, match=problem):
            loads_lines("\n".join([*head[:-1], line]).encode())
    with pytest.raises(ReportFormatError, match="the document's first line is not JSON \\(it nests deeper"):
        loads_lines(("[" * 100_000).encode())


def test_a_cache_entry_holding_values_of_other_types_is_written_again_as_read_and_lends_them_to_no_other_pair(tmp_path: Path) -> None:
    """Reading a cache entry checks a row's key, seqs and verdict, not every value. The writers
    make a pair's text from its kind's template (`_templates`): a damaged entry's 0 for False, a
    window of lists, a name that is a list or a metrics line's 3.5 ULP are encoded value by value,
    never a traceback, and no later pair of the kind is written with them."""
    from sessions.compare.document import (
        PAIR_FIELDS,
        document_bytes,
        document_lines,
        loads_lines,
    )

    native, oracle = _many_small_records(tmp_path, flip_at=30)
    with open_capture(native) as n, open_capture(oracle) as o:
        lines = list(document_lines(run_to_end(iter_compare(n, o, CompareOptions(workers=1)))))
    rows = [at for at, line in enumerate(lines) if line.startswith("pairs\t")]
    metrics = next(at for at, line in enumerate(lines) if line.startswith("metrics\t"))

    def damaged(at: int, name: str, value: object) -> None:
        row = json.loads(lines[at].split("\t", 1)[1])
        row[PAIR_FIELDS.index(name)] = value
        lines[at] = "pairs\t" + json.dumps(row)

    damaged(rows[0], "post_eos", 0)  # the first attn_norm pair: its kind's template is made after it
    damaged(rows[1], "native_window", [[1], 2])
    damaged(rows[2], "native_name", ["x"])
    shared = json.loads(lines[metrics].split("\t", 1)[1])
    lines[metrics] = "metrics\t" + json.dumps({**shared, "max_ulp": 3.5, "differing": 2.5})
    read = loads_lines(("\n".join(lines) + "\n").encode())
    text = dumps(read)
    document = json.loads(text)
    assert '"post_eos": 0, ' in text.splitlines()[[line.startswith(' "pairs"') for line in text.splitlines()].index(True) + 1]
    assert [document["pairs"][at]["post_eos"] is False for at in (11, 22, 33)] == [True, True, True]
    assert document["pairs"][1]["native_window"] == [[1], 2] and document["pairs"][2]["native_name"] == ["x"]
    assert document["error_growth"][0]["max_ulp"] == 3.5 and document["error_growth"][0]["differing"] == 2.5
    again = [line for line in document_bytes(read).decode().splitlines() if line.startswith("pairs\t")]
    assert again[:3] == [lines[at] for at in rows[:3]] and json.loads(again[11].split("\t", 1)[1])[PAIR_FIELDS.index("post_eos")] is False


def test_keys_read_from_a_document_are_the_keys_parse_gives_whatever_their_text() -> None:
    """Reading a document's keys parses the text after the step once per distinct text; every
    key must still be what `OpKey.parse` gives, and every refusal a ValueError or TypeError."""
    from sessions.compare.key import KeyParser

    read = KeyParser()
    texts = [
        "0:visual:0:sdpa", "7:visual:0:sdpa", "007:visual:0:sdpa", " 3:visual:0:sdpa", "12:decode:-1:logits",
        "4:decode:2:q_rope#1", "5:decode:2:q_rope#1", "0:prefill:3:ffn_down@5-1012", "9:prefill:3:ffn_down@5-1012",
        "1:decode:0:attn_norm  ", "2:decode:0:attn_norm  ", "+2:decode:0:sdpa", "-1:decode:0:sdpa", "٣:decode:0:sdpa",
        ":decode:0:sdpa", "1:decode:0:", "1:decode:x:sdpa", "1:decode:0:sdpa@9-3", "3", None, 17,
    ]
    for text in texts * 2:  # the second time, every text after a step is known
        try:
            expected: object = OpKey.parse(text)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            expected = type(exc)
        try:
            got: object = read(text)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            got = type(exc)
        assert got == expected and type(got) is type(expected), text
    assert read("8:decode:2:q_rope#1") == OpKey(8, "decode", 2, "q_rope", 1)


def test_identical_pairs_metrics_are_written_once_in_lines_and_read_back_as_one_object(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    from sessions.compare.document import document_lines, loads_lines

    with open_capture(demo_pairs["clean"][0]) as n, open_capture(demo_pairs["clean"][1]) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    lines = list(document_lines(comparison))
    shapes = {(p.metrics.dtype, tuple(p.metrics.shape)) for p in comparison.pairs}
    assert sum(line.startswith("metrics\t") for line in lines) == len(shapes) < len(comparison.pairs) == 333
    read = loads_lines(("\n".join(lines) + "\n").encode())
    assert dumps(read) == dumps(comparison)
    assert len({id(p.metrics) for p in read.pairs}) == len(shapes)


def test_large_identical_records_settled_from_stored_bytes_get_the_chunked_diffs_metrics(
    demo_pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records larger than a chunk are checked byte for byte first; what they get must be what
    the chunked diff engine gives them (per-row and per-head profiles included)."""
    from sessions.compare import pair_compare
    from sessions.compare.pair_reader import pair_bytes

    native_path, _ = demo_pairs["head-chunk"]
    chunked = CompareOptions(chunk_bytes=1024)
    check = pair_compare._stored_bytes_identical
    large_settled = []

    def counted(pair, reader):  # type: ignore[no-untyped-def]
        same, held = check(pair, reader)
        if same and pair_bytes(pair) > 2 * chunked.chunk_bytes:
            large_settled.append(pair.key)
        return same, held

    with open_capture(native_path) as n, open_capture(native_path) as again:
        monkeypatch.setattr(pair_compare, "_stored_bytes_identical", counted)
        settled = run_to_end(iter_compare(n, again, chunked))
        monkeypatch.setattr(pair_compare, "_stored_bytes_identical", lambda pair, reader: (False, None))
        monkeypatch.setattr(pair_compare, "_runs", lambda pairs, reader, seqs: [])
        streamed = run_to_end(iter_compare(n, again, chunked))
    assert len(large_settled) > 10, "records of several chunks were settled from their bytes"
    assert [p.metrics for p in settled.pairs] == [p.metrics for p in streamed.pairs]


def test_differing_pairs_compared_from_the_bytes_their_check_read_get_the_metrics_of_a_fresh_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions.compare.pair_reader import PairReader, _Side

    native_path, oracle_path = _many_small_records(tmp_path, flip_at=20, diverged=True)
    whole_from = _Side.whole_from
    reused = []

    def counted(side, stored):  # type: ignore[no-untyped-def]
        bits = whole_from(side, stored)
        reused.append(bits is not None)
        return bits

    with open_capture(native_path) as n, open_capture(oracle_path) as o:
        monkeypatch.setattr(_Side, "whole_from", counted)
        from_check = run_to_end(iter_compare(n, o, CompareOptions()))
        monkeypatch.setattr(PairReader, "held_bytes", lambda reader, size: None)
        read_again = run_to_end(iter_compare(n, o, CompareOptions()))
    assert sum(reused) == 2 * (66 - 20), "each differing pair was compared from the bytes its check had read"
    assert [p.metrics for p in from_check.pairs] == [p.metrics for p in read_again.pairs]
    assert from_check.verdict == read_again.verdict and from_check.verdict.first is not None


def _many_small_records(tmp_path: Path, flip_at: int, diverged: bool = False) -> tuple[Path, Path]:
    """Three token steps of two layers of small records, written as a recorder lays them out (a
    step's records back to back in one pack); the native's record `flip_at` one bit apart, and
    with `diverged` every later one a few ULP apart in most elements."""
    ops = ("attn_norm", "q_proj", "k_proj", "v_proj", "sdpa", "o_proj", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down")
    tensor = bf16_bits(np.random.default_rng(4).standard_normal((4, 16)))
    paths = []
    for role in ("native", "oracle"):
        path = tmp_path / f"{role}.h5"
        with CaptureWriter(path, CaptureMeta(role=role, engine_name=f"hand-{role}", weights_hash="sha256:aa")) as writer:
            seq = 0
            for step in range(3):
                for layer in range(2):
                    for op in ops:
                        bits = tensor.copy()
                        if role == "native" and seq == flip_at:
                            bits[2, 5] ^= 1
                        if role == "native" and diverged and seq > flip_at:
                            bits ^= np.random.default_rng(seq).integers(0, 4, size=bits.shape, dtype=np.uint16)
                        writer.add_tensor(op, bits, step=step, segment="decode", layer=layer, dtype="bfloat16")
                        seq += 1
                writer.end_step()
        paths.append(path)
    return paths[0], paths[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_small_records_back_to_back_are_settled_in_runs_and_a_run_with_a_flip_is_compared_pair_by_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A real run's many small records are settled a step's run at a time; the run holding a
    difference goes pair by pair, so the report names the very record and element. On two
    threads, the runs' bytes are checked ahead of the comparison: the same answers, in order."""
    from sessions.capture.reader import stored_span
    from sessions.compare import comparison, pair_compare
    from sessions.compare.byte_checks import ByteChecks

    native, oracle = _many_small_records(tmp_path, flip_at=30)
    runs: list[tuple[int, int]] = []
    answers: list[bool] = []
    real_runs, real_ahead = pair_compare._runs, ByteChecks.ahead

    def counted_runs(pairs, reader, seqs):  # type: ignore[no-untyped-def]
        found = real_runs(pairs, reader, seqs)
        runs.extend((run.start, run.count) for run in found)
        return found

    def counted_ahead(checks, asked):  # type: ignore[no-untyped-def]
        used.append(checks.threads)
        for answer in real_ahead(checks, asked):
            answers.append(answer)
            yield answer

    used: list[int] = []
    with open_capture(native) as n, open_capture(oracle) as o:
        assert [int(a) for a in n.packed_addresses] == [stored_span(n, r)[0] for r in n.records]
        monkeypatch.setattr(pair_compare, "_runs", counted_runs)
        monkeypatch.setattr(ByteChecks, "ahead", counted_ahead)
        monkeypatch.setattr(comparison, "check_threads", lambda options: threads)
        in_runs = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        monkeypatch.setattr(pair_compare, "_runs", lambda pairs, reader, seqs: [])
        pair_by_pair = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    assert used[0] == threads
    assert runs == [(0, 22), (22, 44)], "step 0's 22 records one run; steps 1 and 2, whose packs are back to back in the file, another"
    assert answers == [True, False], "the run holding step 1 differs"
    assert dumps(in_runs) == dumps(pair_by_pair)
    assert [p.key.text() for p in in_runs.pairs if not p.metrics.bit_exact] == ["1:decode:0:ffn_up"]
    assert in_runs.pairs[30].metrics.first_difference is not None and in_runs.pairs[30].metrics.first_difference.coord == [2, 5]


def test_stored_bytes_are_equal_only_when_every_byte_is_small_pieces_word_pieces_and_their_ragged_ends(tmp_path: Path) -> None:
    """Pieces up to SMALL_PIECE_BYTES are compared as bytes, longer ones as 8-byte words and a ragged
    tail: a one-bit difference anywhere, in either kind of piece, is found."""
    from sessions.compare.byte_checks import PIECE_BYTES, SMALL_PIECE_BYTES, ByteChecks
    from sessions.compare.pair_reader import PairReader

    captures = _many_small_records(tmp_path, flip_at=-1)
    data = np.random.default_rng(6).integers(0, 256, PIECE_BYTES + 4099, dtype=np.uint8).tobytes()
    with open_capture(captures[0]) as n, open_capture(captures[1]) as o, ByteChecks(2) as checks, PairReader(n, o, checks) as reader:
        for size in (1000, SMALL_PIECE_BYTES + 13, PIECE_BYTES + 4099):
            for flip in (0, size // 2, size - 9, size - 1):
                native, oracle = tmp_path / "n.bin", tmp_path / "o.bin"
                native.write_bytes(data[:size])
                changed = bytearray(data[:size])
                changed[flip] ^= 0x10
                oracle.write_bytes(bytes(changed))
                with open(native, "rb") as a, open(oracle, "rb") as b:
                    assert not reader.stored_bytes_equal((a.fileno(), 0), (b.fileno(), 0), size), (size, flip)
                    assert reader.stored_bytes_equal((a.fileno(), 0), (a.fileno(), 0), size), size


@pytest.mark.parametrize("threads", [1, 2])
def test_a_difference_in_a_large_records_last_stored_piece_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """One piece after another, or the pieces shared out between two threads."""
    from sessions.compare import byte_checks, comparison

    monkeypatch.setattr(comparison, "check_threads", lambda options: threads)
    monkeypatch.setattr(byte_checks, "PIECE_BYTES", 256)
    monkeypatch.setattr(byte_checks, "STRETCH_BYTES", 512)
    values = bf16_bits(np.random.default_rng(5).standard_normal((64, 32)))
    flipped = values.copy()
    flipped[-1, -1] ^= 1
    n = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", values, layer=0, dtype="bfloat16")])
    o = write_capture(tmp_path / "o.h5", "oracle", [T("l_out-0", flipped, layer=0, dtype="bfloat16")])
    with open_capture(n) as native, open_capture(o) as oracle:
        compared = run_to_end(iter_compare(native, oracle, CompareOptions(chunk_bytes=1024, workers=1)))
    (pair,) = compared.pairs
    assert pair.metrics.differing == 1 and pair.metrics.max_ulp == 1


def test_the_json_document_has_an_item_per_line_and_every_pair_its_own_metrics_however_shared(tmp_path: Path) -> None:
    import json

    from sessions.compare.json_plain import plain

    native, oracle = _many_small_records(tmp_path, flip_at=30)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    assert len({id(p.metrics) for p in comparison.pairs}) == 2, "the identical pairs share one metrics object"
    text = dumps(comparison)
    document = json.loads(text)
    assert [p["metrics"] for p in document["pairs"]] == [plain(p.metrics) for p in comparison.pairs]
    assert document["pairs"][30]["metrics"]["differing"] == 1 and document["pairs"][29]["metrics"]["differing"] == 0
    assert [p["key"] for p in document["error_growth"]] == [p.key.text() for p in comparison.pairs], "the derived list is written"
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert sum(line.startswith('  {"key": ') for line in lines) == 2 * len(comparison.pairs), "each pair and growth point on its own line"


def test_the_json_document_writes_every_pair_and_growth_point_as_its_plain_form_whatever_their_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pairs are written from templates shared by pairs alike (`_pair_items`): each one must still
    read back as exactly its own values, hostile text, windows, manual reasons and non-finite
    NMSE included, and neighbours that share a template must not share their keys or seqs."""
    from sessions.compare import document as document_module
    from sessions.compare.document import (
        PAIR_FIELDS,
        comparison_to_dict,
        document_bytes,
        document_lines,
    )
    from sessions.compare.json_plain import plain
    from sessions.compare.verdict import Kind

    native, oracle = _many_small_records(tmp_path, flip_at=7, diverged=True)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    pairs = list(comparison.pairs)
    hostile = 'q"proj\\ \u00e9\u4e2d {0} %s \x1b[31m\u2028'
    pairs[3] = dataclasses.replace(pairs[3], native_name=hostile, oracle_name="", native_layout="1 heads rows dim -> rows (heads dim)")
    pairs[4] = dataclasses.replace(pairs[4], manual_reason='oracle numbers "layers" from 1', native_window=(5, 1013), oracle_window=(0, 1008))
    pairs[5] = dataclasses.replace(pairs[5], post_eos=True, within_tolerance=False, verdict=Kind.DIVERGED)
    pairs[9] = dataclasses.replace(pairs[9], key=OpKey(2, 'vis"ual', -1, "logits", 3, (5, 9)))
    pairs[12] = dataclasses.replace(pairs[12], metrics=dataclasses.replace(pairs[12].metrics, nmse=float("nan"), max_ulp=None))
    pairs[13] = dataclasses.replace(pairs[13], metrics=dataclasses.replace(pairs[13].metrics, nmse=float("inf")))
    pairs[15] = dataclasses.replace(pairs[15], native_name="sdpa_renamed")  # alike later sdpa pairs but for this name
    pairs[16] = dataclasses.replace(pairs[16], manual_reason="paired by hand")  # alike later o_proj pairs but for this reason
    for at in range(20, 30):  # runs cut differently: each pair its own rows
        pairs[at] = dataclasses.replace(pairs[at], native_window=(at, at + 1), oracle_window=(0, at))
    comparison = dataclasses.replace(comparison, pairs=pairs)
    text = dumps(comparison)
    pair_lines = [line.strip().rstrip(",") for line in text.splitlines() if line.startswith('  {"key": ') and '"native_seq"' in line]
    assert pair_lines == [
        json.dumps({name: plain(getattr(p, name)) for name in (*PAIR_FIELDS, "label") if name != "metrics"})[:-1] + f', "metrics": {json.dumps(plain(p.metrics))}}}'
        for p in pairs
    ], "each pair exactly as json writes its plain form"
    metrics_numbers: dict[int, int] = {}
    for p in pairs:
        metrics_numbers.setdefault(id(p.metrics), len(metrics_numbers))
    rows = [line for line in document_lines(comparison) if line.startswith("pairs\t")]
    assert rows == [
        "pairs\t" + json.dumps([metrics_numbers[id(p.metrics)] if name == "metrics" else plain(getattr(p, name)) for name in PAIR_FIELDS]) for p in pairs
    ], "each cache row exactly as json writes it"
    monkeypatch.setattr(document_module, "ITEMS_PER_PIECE", 4)
    assert dumps(comparison) == text, "items joined a few at a time make the same text"
    assert dumps(loads_lines(document_bytes(comparison))) == text, "the cache's rows, made from templates too, read back as the same pairs"
    document = json.loads(text)
    assert document["pairs"] == comparison_to_dict(comparison)["pairs"]
    assert document["error_growth"] == comparison_to_dict(comparison)["error_growth"]
    assert document["pairs"][3]["native_name"] == hostile and document["pairs"][4]["native_window"] == [5, 1013]
    assert document["pairs"][9]["key"] == '2:vis"ual:-1:logits#3@5-8' and document["pairs"][9]["label"] == 'step 2 vis"ual logits#3 positions 5–8'
    growth = {point["key"]: point for point in document["error_growth"]}
    assert pairs[5].key.text() not in growth, "a pair after the shared EOS is not followed"
    assert growth[pairs[12].key.text()] == {"key": pairs[12].key.text(), "max_ulp": None, "nmse": "NaN", "differing": pairs[12].metrics.differing}
    assert growth[pairs[13].key.text()]["nmse"] == "Infinity" and growth[pairs[14].key.text()]["max_ulp"] == pairs[14].metrics.max_ulp > 0
    assert [p["native_seq"] for p in document["pairs"]] == [p.native_seq for p in pairs] == list(range(len(pairs)))
    assert [p["native_name"] for p in document["pairs"][15::11]] == ["sdpa_renamed", "sdpa", "sdpa", "sdpa", "sdpa"]
    assert [p["manual_reason"] for p in document["pairs"][16::11]] == ["paired by hand", None, None, None, None]

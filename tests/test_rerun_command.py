"""`parity-xray rerun` end to end, and weights from a GGUF file or from the capture itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from backends.engines.demo_model import load_weights
from backends.rerun.inputs import RerunInputError
from backends.rerun.segment import RerunOptions, iter_rerun, rerun_target
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter
from sessions.compare.comparison import iter_compare
from sessions.progress import run_to_end
from viewer.cli import main


@pytest.mark.slow
def test_the_command_reruns_on_the_native_route_and_writes_json(demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["attention-contract"]
    out, saved = tmp_path / "rerun.json", tmp_path / "rerun.h5"
    code = main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--route-from", "native", "--json", str(out), "--save", str(saved)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "attn.bf16.single_range" in printed and "Metal would take sdpa_full" in printed and "decomposed fallback" in printed
    document = json.loads(out.read_text())
    assert document["key"] == "0:visual:0:sdpa" and document["reproduces"] == {"native": True, "oracle": False}
    assert document["ops"][0]["closer"] == "oracle"
    assert document["ops"][0]["three_way"]["rerun vs native"]["bit_exact"] is True
    with open_capture(saved) as rerun:
        assert rerun.meta.role == "rerun"


def test_a_rerun_that_reproduces_the_oracle_measures_the_native_against_it_as_report_does(demo_pairs: dict, tmp_path: Path) -> None:
    native, oracle = demo_pairs["attention-contract"]
    out = tmp_path / "rerun.json"
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--json", str(out)]) == 0
    three_way = json.loads(out.read_text())["ops"][0]["three_way"]
    assert three_way["rerun vs oracle"]["bit_exact"] is True
    assert three_way["rerun vs native"]["nmse"] == three_way["native vs oracle"]["nmse"] == pytest.approx(1.1927e-05, rel=1e-4)


def test_only_a_rerun_with_an_attention_says_how_the_cpu_ran_attention(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    main(["rerun", str(native), str(oracle), "--op", "0:text-before:0:ffn_act"])
    assert "fused attention kernel" not in capsys.readouterr().out
    main(["rerun", str(native), str(oracle), "--op", "0:text-before:0:attention_block"])
    assert "Ran on the CPU: MLX has no fused attention kernel there" in capsys.readouterr().out


def test_the_text_names_where_a_reruns_weights_came_from(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["clean"]
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:q_proj"]) == 0
    assert f"\nweights from {native.parent / 'demo-qwen3-tiny.safetensors'}\n" in capsys.readouterr().out
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa"]) == 0
    assert "\nweights: none taken (no op of this rerun multiplies by one)\n" in capsys.readouterr().out


def test_the_route_header_names_only_the_parts_the_reruns_ops_take(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """A q_proj rerun named an attention route, and the kernel of an sdpa record it never read."""
    native, oracle = demo_pairs["clean"]
    routes = {}
    for op in ("q_proj", "ffn_act", "sdpa"):
        assert main(["rerun", str(native), str(oracle), "--op", f"0:visual:0:{op}"]) == 0
        routes[op] = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("device ")).split("route: ", 1)[1]
    assert routes["q_proj"] == "each op as its row says"
    assert routes["ffn_act"].startswith("swiglu ") and "attention" not in routes["ffn_act"]
    assert routes["sdpa"].startswith("attention ") and "; head-chunk " in routes["sdpa"] and "swiglu" not in routes["sdpa"]
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:q_proj", "--attention-route", "attn.f32.tiled64x64"]) == 0
    assert "route: attention attn.f32.tiled64x64 (chosen; no op of this rerun takes it)\n" in capsys.readouterr().out


def test_weights_named_for_a_rerun_that_takes_none_are_said_to_be_unread(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["attention-contract"]
    weights = oracle.parent / "demo-qwen3-tiny.safetensors"
    main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--weights", str(weights)])
    assert f"The weights file {weights} was not read: no op of this rerun takes a weight." in capsys.readouterr().out.splitlines()
    main(["rerun", str(native), str(oracle), "--op", "0:visual:0:o_proj", "--weights", str(weights)])
    assert "was not read" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["diagnose"], ["rerun", "--op", "0:visual:0:sdpa"]])
def test_weights_that_name_no_file_are_refused_before_any_work_even_where_no_op_reads_them(
    demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Read only when an op took a weight: diagnose exited 0 without a word about a missing file."""
    native, oracle = demo_pairs["attention-contract"]
    (tmp_path / "empty.safetensors").write_bytes(b"")
    for weights, problem in ((tmp_path / "absent.safetensors", "does not exist"), (tmp_path, "is a directory, not a regular file"), (tmp_path / "empty.safetensors", "is empty (0 bytes)")):
        assert main([command[0], str(native), str(oracle), *command[1:], "--weights", str(weights)]) == 2
        assert capsys.readouterr().err == f"parity-xray {command[0]}: weights file {weights} (named for this rerun) {problem}\n"


@pytest.mark.slow
def test_the_command_exits_1_when_the_rerun_does_not_reproduce_its_route_side(demo_pairs: dict) -> None:
    native, oracle = demo_pairs["attention-contract"]
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--attention-route", "mlx.fast.sdpa"]) == 1


def test_a_rerun_names_reports_kind_of_its_op_where_its_own_figures_say_bit_exact_or_differ(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Of the head-chunk finding it said only "bit-exact", and of a signed-zero-only op "the sides differ"."""
    native, oracle = demo_pairs["head-chunk"]
    assert main(["rerun", str(native), str(oracle), "--op", "0:text-after:0:sdpa"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "The rerun on the oracle route reproduces the bits of: native, oracle. The bits agree at sdpa, which report calls dispatch-only: "
        "the engines split its attention into different calls (the route's calls are listed below)."
    )
    native, oracle = demo_pairs["signed-zero"]
    main(["rerun", str(native), str(oracle), "--op", "0:text-before:0:ffn_act"])
    assert "First op where the bits differ: ffn_act (signed-zero-only);" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("route", "code", "reproduced"), [("attn.bf16.single_range", 0, "native"), ("attn.f32.tiled64x64", 1, "oracle")]
)
def test_with_a_route_override_the_exit_code_and_the_first_line_say_whether_that_route_gives_the_route_from_sides_bits(
    demo_pairs: dict, route: str, code: int, reproduced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/rerun.md: a test of what the native ran, on the oracle's inputs. The text said it
    only through the exit status; its first line is the panel's verdict sentence."""
    native, oracle = demo_pairs["attention-contract"]
    args = ["--op", "0:visual:0:sdpa", "--from", "oracle", "--route-from", "native", "--attention-route", route]
    assert main(["rerun", str(native), str(oracle), *args]) == code
    assert capsys.readouterr().out.splitlines()[0] == (
        f"The rerun on the native route with attention {route} chosen reproduces the bits of: {reproduced}. "
        "First op where the bits differ: sdpa (contract-mismatch); against the float64 reference, the oracle side is closer to exact."
    )
    assert main(["rerun", str(native), str(oracle), *args, "--swiglu-order", "mul_then_sigmoid"]) == code
    assert capsys.readouterr().out.splitlines()[0].startswith(f"The rerun on the native route with attention {route} chosen reproduces"), (
        "a SwiGLU order no op of an sdpa rerun takes is not part of its route"
    )


@pytest.mark.slow
def test_the_command_names_an_op_the_comparison_did_not_pair_and_exits_2(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["clean"]
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:7:sdpa", "--from", "native"]) == 2
    assert capsys.readouterr().err == (
        "parity-xray rerun: 0:visual:7:sdpa is not an aligned op of this comparison (report lists the aligned ops; a rerun reads the records it paired)\n"
    )
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa@5-76"]) == 2
    assert "0:visual:0:sdpa@5-76 is not an aligned op of this comparison" in capsys.readouterr().err
    assert main(["rerun", str(native), str(oracle), "--op", "visual:0:sdpa"]) == 2
    assert "is not STEP:SEGMENT:LAYER:OP" in capsys.readouterr().err


@pytest.mark.slow
def test_an_op_after_the_shared_eos_is_said_to_be_post_eos_not_a_record_without_a_partner(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """It read "its native record 'kqv_out-0' has no partner (no partner: ...)", where report says post-EOS records are invalid, never failures."""
    native, oracle = demo_pairs["post-eos"]
    assert main(["rerun", str(native), str(oracle), "--op", "4:decode:0:sdpa"]) == 2
    assert capsys.readouterr().err == (
        "parity-xray rerun: 4:decode:0:sdpa is not an aligned op of this comparison: step 4 is after the shared EOS (step 3), where one run "
        "stopped; post-EOS records are invalid, never failures (report lists the aligned ops; a rerun reads the records it paired)\n"
    )
    assert main(["rerun", str(native), str(oracle), "--op", "9:decode:0:sdpa"]) == 2
    assert capsys.readouterr().err == (
        "parity-xray rerun: 9:decode:0:sdpa is not an aligned op of this comparison (report lists the aligned ops; a rerun reads the records it paired)\n"
    ), "a step neither run reached is a mistaken key, not a post-EOS record"


def test_keys_parse_with_an_optional_occurrence() -> None:
    key = rerun_target("2:decode:1:sdpa#1")
    assert (key.step, key.segment, key.layer, key.op, key.occurrence) == (2, "decode", 1, "sdpa", 1)
    with pytest.raises(ValueError, match="STEP, LAYER, OCCURRENCE and positions must be integers"):
        rerun_target("x:visual:0:sdpa")


@pytest.mark.slow
def test_quantized_gguf_weights_are_decoded_with_the_gguf_package(demo_pairs: dict, tmp_path: Path) -> None:
    native, oracle = demo_pairs["clean"]
    weights = load_weights(oracle.parent / "demo-qwen3-tiny.safetensors")
    w = np.array(weights["model.layers.0.self_attn.q_proj.weight"].astype(mx.float32))
    blocks = quantize(w, GGMLQuantizationType.Q8_0)
    path = tmp_path / "q8.gguf"
    writer = GGUFWriter(str(path), "qwen3")
    writer.add_tensor("blk.0.attn_q.weight", blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open_capture(native) as n, open_capture(oracle) as o:
        result = run_to_end(iter_rerun(n, o, run_to_end(iter_compare(n, o)), rerun_target("0:text-before:0:q_proj"), RerunOptions(weights_path=str(path))))
        x = next(r for r in o.records if r.name == "model.layers.0.input_layernorm" and r.segment == "text-before")
        x_mx = mx.array(o.read_bits(x)[0]).view(mx.bfloat16)
    decoded = mx.array(dequantize(blocks, GGMLQuantizationType.Q8_0)).astype(mx.bfloat16)
    expected = np.array((x_mx @ decoded.T).view(mx.uint16))
    assert np.array_equal(result.ops[0].bits, expected)
    assert not result.ops[0].three_way["rerun vs oracle"].bit_exact  # type: ignore[union-attr]


def test_weights_stored_in_the_capture_are_used_before_any_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 16)).astype(np.float32)
    w = rng.normal(size=(8, 16)).astype(np.float32)
    path = tmp_path / "canonical.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        writer.add_tensor("attn_norm", x, step=0, segment="prefill", layer=0)
        writer.add_tensor("q_proj", np.array(mx.array(x) @ mx.array(w).T), step=0, segment="prefill", layer=0)
        writer.add_tensor("model.layers.0.self_attn.q_proj.weight", w, step=0, segment="prefill", layer=0)
    with open_capture(path) as native, open_capture(path) as oracle:
        result = run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:prefill:0:q_proj"), RerunOptions(source="native")))
    assert result.reproduces("native") and result.ops[0].dtype == "float32"
    assert result.ops[0].exact["rerun"].rmse < 1e-5


def test_a_weight_neither_the_capture_nor_a_file_holds_is_asked_for_with_the_option_that_names_one(tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    path = tmp_path / "no-weights.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        writer.add_tensor("attn_norm", x, step=0, segment="prefill", layer=0)
        writer.add_tensor("q_proj", x[:, :8].copy(), step=0, segment="prefill", layer=0)
    with open_capture(path) as native, open_capture(path) as oracle, pytest.raises(RerunInputError) as missing:
        run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:prefill:0:q_proj"), RerunOptions(source="native")))
    assert str(missing.value).endswith(
        "neither the native capture nor a referenced weights file holds it (`--weights FILE` names the file that does)"
    )


def _record_without_config(pair: tuple[Path, Path], tmp_path: Path, config: dict | None = None, **where: str) -> tuple[Path, Path]:
    """The tiny llama.cpp/MLX pair recorded again as an older recorder wrote it: no provenance
    config, or `config` (`where` may also point the weights references elsewhere)."""
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.mlx_recorder import iter_record_mlx
    from backends.recorders.record_schedule import TokenSchedule

    folder = pair[0].parent
    with open_capture(pair[0], check_in_child=False) as capture:
        schedule = TokenSchedule(tuple(capture.meta.provenance["prompt_tokens"]))
    native, oracle = tmp_path / "native.h5", tmp_path / "oracle.h5"
    run_to_end(iter_record_llama(folder / "tiny.f32.gguf", schedule, native, extra={"config": config or {}, **where}))
    run_to_end(iter_record_mlx(folder / "mlx-f32", schedule, oracle, extra={"config": config or {}, **where}))
    return native, oracle


@pytest.mark.parametrize(
    "config", [{}, {"rms_norm_eps": None, "rope_theta": "fast"}, {"rms_norm_eps": -1e-6, "rope_theta": float("inf")}, {"rms_norm_eps": 10**400, "rope_theta": 10**400}]
)
def test_a_capture_without_a_usable_config_takes_eps_and_rope_base_from_the_weights_file_it_references(
    llama_tiny_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict
) -> None:
    native, oracle = _record_without_config(llama_tiny_pairs["f32"], tmp_path, config)
    with open_capture(native, check_in_child=False) as capture:
        assert capture.meta.provenance["config"] == config
    for op in ("q_norm", "q_rope"):
        out = tmp_path / f"{op}.json"
        assert main(["rerun", str(native), str(oracle), "--op", f"0:prefill:0:{op}", "--json", str(out)]) == 0
        assert json.loads(out.read_text())["ops"][0]["three_way"]["rerun vs oracle"]["bit_exact"] is True, op


def test_a_scalar_no_capture_and_no_weights_file_names_is_asked_for_by_name(
    llama_tiny_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = _record_without_config(llama_tiny_pairs["f32"], tmp_path, gguf=str(tmp_path / "gone.gguf"), model_dir=str(tmp_path / "gone"))
    assert main(["rerun", str(native), str(oracle), "--op", "0:prefill:0:q_rope"]) == 2
    assert (
        "q_rope rerun needs rope_theta; neither capture's provenance config nor a weights file they reference names it "
        "as a finite number above 0 (docs/capture-format.md, provenance `config`)"
    ) in capsys.readouterr().err


def _copied_pair(demo_pairs: dict, tmp_path: Path) -> tuple[Path, Path, Path]:
    """The attention-contract pair and the weights file it references, copied: the files an output must not replace."""
    native, oracle = (Path(shutil.copy2(p, tmp_path / p.name)) for p in demo_pairs["attention-contract"])
    weights = Path(shutil.copy2(demo_pairs["attention-contract"][0].parent / "demo-qwen3-tiny.safetensors", tmp_path))
    return native, oracle, weights


@pytest.mark.parametrize(
    ("command", "output", "target", "what"),
    [
        ("rerun", "--save", "native", "the native capture"),
        ("rerun", "--json", "oracle", "the oracle capture"),
        ("rerun", "--save", "weights", "the native capture's weights file"),
        ("diagnose", "--json", "native", "the native capture"),
        ("diagnose", "--html", "weights", "the native capture's weights file"),
    ],
)
def test_an_output_naming_a_capture_or_the_weights_it_reads_is_refused_and_the_file_kept(
    demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, output: str, target: str, what: str
) -> None:
    native, oracle, weights = _copied_pair(demo_pairs, tmp_path)
    path = {"native": native, "oracle": oracle, "weights": weights}[target]
    before = path.read_bytes()
    op = ["--op", "0:visual:0:sdpa"] if command == "rerun" else []
    assert main([command, str(native), str(oracle), *op, output, str(path)]) == 2
    assert capsys.readouterr().err == f"parity-xray {command}: {output} {path} is {what}: an output never replaces an input\n"
    assert path.read_bytes() == before


@pytest.mark.slow
def test_outputs_that_cannot_be_written_are_one_line_and_exit_2(demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["attention-contract"]
    missing = tmp_path / "absent" / "x.json"
    assert main(["diagnose", str(native), str(oracle), "--json", str(missing)]) == 2
    assert capsys.readouterr().err == f"parity-xray diagnose: --json {missing} is in {missing.parent}, which does not exist\n"
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"parity-xray rerun: --json {tmp_path} is a folder; name a file\n"
    assert main(["rerun", str(native), str(oracle), "--op", "0:visual:0:sdpa", "--save", str(missing)]) == 2
    assert capsys.readouterr().err == f"parity-xray rerun: --save {missing} is in {missing.parent}, which does not exist\n"


def test_diagnose_refuses_an_empty_key_and_escapes_a_control_character_in_one(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["attention-contract"]
    assert main(["diagnose", str(native), str(oracle), "--op", ""]) == 2
    assert capsys.readouterr().err.startswith("parity-xray diagnose: key '' is not STEP:SEGMENT:LAYER:OP")
    assert main(["diagnose", str(native), str(oracle), "--op", "0:visual:0:sd\x1b[31mpa"]) == 2
    assert capsys.readouterr().err.startswith("parity-xray diagnose: 0:visual:0:sd\\x1b[31mpa is not an aligned op of this comparison: 'sd\\x1b[31mpa' is no canonical op (they are embed, attn_rms,")

"""Engine profiles: built-ins map each engine's names, user TOML files load by path."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.rerun.inputs import NOT_RERUNNABLE, OP_INPUTS
from sessions.compare.layout_transform import LayoutError, LayoutTransform
from sessions.compare.profile_identity import profile_content_hash
from sessions.compare.profiles import (
    CANONICAL_OPS,
    MAX_PROFILE_BYTES,
    STAGE_OF,
    Profile,
    ProfileError,
    builtin_profiles,
    detect_profile,
    load_profile_file,
    profile_from_dict,
    resolve_profile,
)
from tests.side_files import fifo_without_writer, sparse_file


def _op(profile: str, name: str, occurrence: int = 0, count: int = 1) -> tuple[str, int | None, int] | None:
    match = builtin_profiles()[profile].match(name, occurrence, count)
    return None if match is None else (match.op, match.layer, match.occurrence)


def test_canonical_profile_passes_names_and_occurrences_through() -> None:
    assert _op("canonical", "q_rope", 2, 3) == ("q_rope", None, 2)
    assert _op("canonical", "Qcur-0") is None


def test_the_canonical_profile_names_every_canonical_op_and_each_op_is_rerun_or_says_why_not() -> None:
    assert [rule.op for rule in builtin_profiles()["canonical"].rules] == list(CANONICAL_OPS)
    assert set(OP_INPUTS).isdisjoint(NOT_RERUNNABLE) and set(OP_INPUTS) | set(NOT_RERUNNABLE) == set(CANONICAL_OPS)
    assert {stage: NOT_RERUNNABLE[stage].rsplit(": ", 1)[1] for stage in STAGE_OF} == {stage: f"rerun {op}, which computes it" for stage, op in STAGE_OF.items()}


def test_a_canonical_occurrence_without_occurrence_fixes_the_occurrence_and_changes_the_identity() -> None:
    """Before, `canonical_occurrence` counted only beside `occurrence`: a rule whose meaning did
    not change keeps its identity (saved sessions and reports still match), one whose did gets a new one."""
    def profile(**rule: object) -> Profile:
        return profile_from_dict({"name": "p", "rule": [{"name": "x", "op": "embed", **rule}]}, "p.toml")

    passed, fixed = profile(), profile(canonical_occurrence=0)
    assert [p.match("x", 2, 3).occurrence for p in (passed, fixed)] == [2, 0]  # type: ignore[union-attr]
    assert profile_content_hash(passed) != profile_content_hash(fixed)
    assert profile_content_hash(profile(occurrence=1)) == profile_content_hash(profile(occurrence=1, canonical_occurrence=0))


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("inp_embd", "embed"), ("attn_norm-3", "attn_norm"), ("Vcur-3", "v_proj"), ("Qcur_normed-3", "q_norm"),
        ("Kcur_normed-3", "k_norm"), ("kqv_out-3", "sdpa"), ("attn_out-3", "o_proj"), ("ffn_inp-3", "attn_residual"),
        ("ffn_norm-3", "ffn_norm"), ("ffn_gate-3", "ffn_gate"), ("ffn_up-3", "ffn_up"), ("ffn_swiglu-3", "ffn_act"),
        ("ffn_out-3", "ffn_down"), ("l_out-3", "layer_out"), ("result_norm", "final_norm"), ("result_output", "logits"),
    ],
)
def test_llama_cpp_profile_maps_graph_names(name: str, op: str) -> None:
    result = _op("llama.cpp", name)
    assert result is not None and result[0] == op
    if name[-1].isdigit():
        assert result[1] == 3


def test_llama_cpp_occurrence_rule_without_a_norm_stage() -> None:
    assert _op("llama.cpp", "Qcur-2", 0, 2) == ("q_proj", 2, 0)
    assert _op("llama.cpp", "Qcur-2", 1, 2) == ("q_rope", 2, 0)


def test_llama_cpp_occurrence_rule_with_a_norm_stage() -> None:
    assert _op("llama.cpp", "Kcur-2", 0, 3) == ("k_proj", 2, 0)
    assert _op("llama.cpp", "Kcur-2", 1, 3) == ("k_norm", 2, 0)
    assert _op("llama.cpp", "Kcur-2", 2, 3) == ("k_rope", 2, 0)


@pytest.mark.parametrize(
    ("name", "occurrence", "op"),
    [
        ("model.embed_tokens", 0, "embed"), ("model.layers.1.self_attn.q_proj", 0, "q_proj"),
        ("model.layers.1.self_attn.q_norm", 0, "q_norm"), ("model.layers.1.self_attn.rope", 0, "q_rope"),
        ("model.layers.1.self_attn.rope", 1, "k_rope"), ("model.layers.1.self_attn.sdpa", 0, "sdpa"),
        ("model.layers.1.mlp.swiglu", 0, "ffn_act"), ("model.layers.1", 0, "layer_out"), ("lm_head", 0, "logits"),
    ],
)
def test_mlx_lm_profile_maps_module_paths(name: str, occurrence: int, op: str) -> None:
    result = _op("mlx-lm", name, occurrence, 2 if name.endswith("rope") else 1)
    assert result is not None and result[0] == op


def test_detection_picks_the_profile_that_knows_most_names() -> None:
    detected = detect_profile(["Qcur-0", "l_out-0", "result_output", "something_else"])
    assert detected is not None and detected.name == "llama.cpp"
    mlx = detect_profile(["model.layers.0", "lm_head"])
    assert mlx is not None and mlx.name == "mlx-lm"
    assert detect_profile(["x", "y"]) is None


def test_user_profile_loads_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n[contracts]\n"c.auto" = ["c.a", "c.b"]\n'
        '[[rule]]\nname = "blk.{layer}.out"\nop = "layer_out"\nlayout = "rows h d -> rows (h d)"\n'
    )
    profile = resolve_profile(str(path))
    match = profile.match("blk.7.out", 0, 1)
    assert match is not None and (match.op, match.layer) == ("layer_out", 7)
    assert profile.contracts == {"c.auto": ("c.a", "c.b")}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "x"\n[[rule]]\nname = "a"\nop = "nope"\n', "not a canonical op"),
        ('name = "x"\n[[rule]]\nname = "a"\nop = "embed"\noccurrence = "first"\n', "occurrence"),
        ('name = "x"\n[[rule]]\nname = "a"\nop = "embed"\nlayout = "a b -> a"\n', "exactly once"),
        ('name = "x"\n', "at least one"),
        ("name = ", "not valid TOML"),
        ("x = " + "[" * 50_000 + "]" * 50_000 + "\n", r"not valid TOML \(it nests deeper than a reader follows\)"),
        ('name = "x"\n[[rule]]\nname = "' + "{any}a" * 20 + '"\nop = "embed"\n', r"rule 1: name or source pattern: 20 \{any\}/\{n\} wildcards; a pattern takes at most 3"),
    ],
)
def test_bad_user_profiles_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message) as err:
        load_profile_file(path)
    assert str(path) in str(err.value)


def test_layout_transform_squeezes_transposes_and_merges_bit_for_bit() -> None:
    import numpy as np

    stored = np.arange(1 * 2 * 3 * 4, dtype=np.uint16).reshape(1, 2, 3, 4)
    transform = LayoutTransform.parse("1 heads rows dim -> rows (heads dim)")
    out = transform.apply(stored)
    assert out.shape == (3, 8) and transform.output_shape(stored.shape) == (3, 8)
    assert np.array_equal(out, stored[0].transpose(1, 0, 2).reshape(3, 8))
    with pytest.raises(LayoutError, match="size 1"):
        transform.output_shape((2, 2, 3, 4))


def test_a_profile_that_is_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    with fifo_without_writer(tmp_path, "engine.toml") as path, pytest.raises(ProfileError) as err:
        load_profile_file(path)
    assert str(err.value) == f"{path}: cannot read (not a regular file: a FIFO)"


def test_a_profile_that_is_a_device_is_refused_instead_of_read_without_end() -> None:
    with pytest.raises(ProfileError, match=r"^/dev/zero: cannot read \(not a regular file: a character device\)$"):
        load_profile_file("/dev/zero")


def test_a_profile_over_its_size_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    path = sparse_file(tmp_path / "engine.toml", MAX_PROFILE_BYTES + 1)
    with pytest.raises(ProfileError) as err:
        load_profile_file(path)
    assert str(err.value) == f"{path}: cannot read ({MAX_PROFILE_BYTES + 1} bytes, over the {MAX_PROFILE_BYTES}-byte limit for this kind of file)"


@pytest.mark.parametrize(
    ("toml", "where", "shown"),
    [
        ('name = "evil\\u001b[2J"\n[[rule]]\npattern = "x"\nop = "sdpa"\n', "name", "evil\\x1b[2J"),
        ('name = "p"\n[[rule]]\npattern = "x"\none_sided = "why\\u0007"\n', "rule.0.one_sided", "why\\x07"),
    ],
)
def test_a_profile_string_holding_a_control_character_is_refused_naming_where(tmp_path: Path, toml: str, where: str, shown: str) -> None:
    path = tmp_path / "evil.toml"
    path.write_text(toml)
    with pytest.raises(ProfileError) as refused:
        load_profile_file(path)
    assert str(refused.value) == f"{path}: {where} holds a control character ({shown}): a profile's words are printed in every report"

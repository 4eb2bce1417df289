"""The session file: every field survives a round trip, old files migrate, newer files are left alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sessions.capture.identity import CaptureIdentity
from sessions.compare.key import OpKey, RecordKey
from sessions.investigation.bookmarks_markdown import bookmarks_markdown
from sessions.investigation.model import (
    ChangeKind,
    ColourScale,
    Investigation,
    RecordRef,
    SavedTolerance,
    ViewState,
)
from sessions.investigation.schema import (
    SCHEMA_VERSION,
    SessionFormatError,
    dumps,
    loads,
)
from sessions.investigation.store import (
    SessionDocument,
    SessionOpenError,
    SessionReadOnlyError,
)

FIXTURES = Path(__file__).parent / "fixtures" / "sessions"


def identity(n: int) -> CaptureIdentity:
    return CaptureIdentity(size=1000 + n, mtime_ns=1_784_000_000_000_000_000 + n, sha256=f"{n:064x}")


def full_session(data_dir: Path) -> Investigation:
    """A session in which every field holds something other than its default."""
    s = Investigation(created_utc="2026-07-14T16:03:10+00:00")
    s.set_title("Qwen3 head-chunked SDPA vs MTPLX oracle")
    s.set_summary("Rows 3-8 move from fallback to the vector kernel; bits change at layer 0.")
    native = s.add_capture("native", data_dir / "native.h5", identity(1), profile="llama.cpp")
    s.add_capture("oracle", data_dir / "oracle-cpu.h5", identity(2), profile="mlx-lm")
    metal = s.add_capture("oracle", data_dir / "oracle-metal.h5", identity(3), location="/run1", profile="mlx-lm")
    s.add_rerun(data_dir / "rerun.h5", identity(4), description="sdpa with head chunking off", op=OpKey(0, "prefill", 0, "sdpa"))
    s.set_tolerance(SavedTolerance(max_ulp=1, atol=1e-3, rtol=1e-2, nmse=1e-6))
    s.set_tolerance(SavedTolerance(max_ulp=4), op="logits")
    s.set_tolerance_policy(data_dir / "policy.toml")
    s.set_alignment_mode("positions")
    s.add_override(
        "pair",
        RecordRef(native.id, RecordKey(0, "visual", 0, "Qcur-0", 2)),
        RecordRef(metal.id, RecordKey(0, "visual", 0, "model.layers.0.self_attn.rope", 0)),
        "Qcur is named again after RoPE",
    )
    view = ViewState(
        slices=(0, (0, 64, None), (None, None, 2)),
        colour_scale=ColourScale(mode="ulp", colormap="RdBu", vmin=-4.0, vmax=4.0),
        layout={"splitter": [320, 900], "visible": ["timeline", "bits"], "dock": {"tab": 2}},
    )
    s.select_op(OpKey(0, "visual", 0, "sdpa", 1))
    s.set_view(view)
    s.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "Q=1008 visual prefill: tiled reduction", view)
    s.add_bookmark(OpKey(3, "decode", -1, "logits"), "token 3 flips: 1 ULP at argmax")
    return s


def test_every_session_field_survives_save_and_open(tmp_path: Path) -> None:
    session = full_session(tmp_path / "data")
    for f in dataclasses.fields(Investigation):
        if f.compare:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert getattr(session, f.name) != default, f"the round-trip session leaves {f.name} at its default"
    document = SessionDocument(session)
    document.save_as(tmp_path / "work.xray")

    reopened = SessionDocument.open(tmp_path / "work.xray")

    assert reopened.session == session
    assert reopened.notices == []
    assert not reopened.dirty and not reopened.read_only
    assert reopened.session.captures[0].relative_path == "data/native.h5"
    assert reopened.session.bookmarks[0].view is not None
    assert reopened.session.bookmarks[0].view.selection() == (0, slice(0, 64, None), slice(None, None, 2))


def test_a_session_file_holds_paths_and_identities_never_capture_data(tmp_path: Path) -> None:
    text = dumps(full_session(tmp_path)).decode()
    document = json.loads(text)
    assert document["schema_version"] == SCHEMA_VERSION
    assert document["session"]["captures"][2] == {
        "id": "oracle-2",
        "role": "oracle",
        "path": str(tmp_path / "oracle-metal.h5"),
        "location": "/run1",
        "relative_path": None,
        "profile": "mlx-lm",
        "identity": {"size": 1003, "mtime_ns": 1_784_000_000_000_000_003, "sha256": f"{3:064x}"},
    }
    assert len(text) < 8000


def test_every_edit_bumps_the_revision_and_names_its_kind() -> None:
    session = Investigation()
    seen: list[ChangeKind] = []
    unsubscribe = session.subscribe(seen.append)
    mark = session.add_bookmark(OpKey(0, "prefill", 2, "q_norm"), "first")
    session.set_note(mark.id, "second")
    session.set_view(ViewState(slices=(1,)))
    unsubscribe()
    session.remove_bookmark(mark.id)
    assert seen == [ChangeKind.BOOKMARK, ChangeKind.NOTE, ChangeKind.VIEW]
    assert session.revision == 4


def test_edits_that_the_file_could_not_hold_are_refused() -> None:
    session = Investigation()
    with pytest.raises(ValueError, match="plain JSON"):
        session.set_view(ViewState(layout={"zoom": float("nan")}))
    with pytest.raises(ValueError, match="axis 1"):
        ViewState(slices=(0, (1, 2)))
    with pytest.raises(ValueError, match="slice of axis 0 has a step of 0, which no selection takes"):
        ViewState(slices=((0, 5, 0),))
    with pytest.raises(ValueError, match=r"slice of axis 1 must be an index or \[start, stop, step\] of indices"):
        ViewState(slices=(0, (0, 10**30, 1)))
    with pytest.raises(ValueError, match="reason"):
        session.add_override("pair", RecordRef("native", RecordKey(0, "x", 0, "a")), RecordRef("oracle", RecordKey(0, "x", 0, "b")), " ")
    with pytest.raises(ValueError, match="role"):
        session.add_capture("reference", "/x.h5", identity(0))
    with pytest.raises(ValueError, match="is not one of auto, calls, positions"):
        session.set_alignment_mode("tokens")
    assert session.revision == 0


def old_version_fixtures() -> list[tuple[int, Path]]:
    return [(v, FIXTURES / f"v{v}.xray") for v in range(1, SCHEMA_VERSION)]


def test_there_is_a_fixture_for_every_old_schema_version() -> None:
    assert [path.exists() for _, path in old_version_fixtures()] == [True] * (SCHEMA_VERSION - 1)


@pytest.mark.parametrize(("version", "fixture"), old_version_fixtures(), ids=lambda x: str(x))
def test_old_session_files_migrate_to_the_current_schema(version: int, fixture: Path, tmp_path: Path) -> None:
    copy = tmp_path / fixture.name
    copy.write_bytes(fixture.read_bytes())

    document = SessionDocument.open(copy)

    assert not document.read_only
    assert document.notices and f"schema {version}" in document.notices[0]
    s = document.session
    assert [(c.id, c.role, c.path, c.location, c.profile) for c in s.captures] == [
        ("native", "native", Path("/data/parity/ck-native.h5"), "/", "llama.cpp"),
        ("oracle", "oracle", Path("/data/parity/llama-oracle.h5"), "/", "mlx-lm"),
    ]
    assert s.captures[1].identity == CaptureIdentity(47923200, 1784120311987654321, "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b")
    assert s.selected_op == OpKey(0, "visual", 0, "sdpa", 0)
    assert s.overrides[0].left == RecordRef("native", RecordKey(0, "visual", 0, "Qcur-0", 2))
    assert s.overrides[0].right == RecordRef("oracle", RecordKey(0, "visual", 0, "model.layers.0.self_attn.rope", 0))
    assert s.overrides[1].action == "unpair"
    assert [(b.op.segment, b.note, b.view) for b in s.bookmarks] == [
        ("visual", "Q=1008 visual prefill: tiled reduction", None),
        ("text-after", "Q=14 single-range FP16: matches", None),
    ]
    assert s.view.slices == (0, (0, 64, None), (None, None, None))
    assert s.view.layout["visible"] == ["timeline", "heatmap", "bits"]
    assert s.tolerance_for("logits") == SavedTolerance(max_ulp=2, atol=0.001)
    assert s.tolerance_for("sdpa") == SavedTolerance()
    assert s.tolerance_policy is None
    assert s.alignment_mode == "auto"
    assert [(r.capture.id, r.capture.role, r.op, r.description) for r in s.reruns] == [
        ("rerun", "rerun", OpKey(0, "visual", 0, "sdpa"), "sdpa with the 64x64 tiled FP32 contract")
    ]

    document.save()
    assert json.loads(copy.read_bytes())["schema_version"] == SCHEMA_VERSION
    assert json.loads((tmp_path / f"{fixture.name}.1").read_bytes())["schema_version"] == version
    assert SessionDocument.open(copy).session == s


def newer_schema_bytes(tmp_path: Path) -> bytes:
    document = json.loads(dumps(full_session(tmp_path)))
    document["schema_version"] = SCHEMA_VERSION + 1
    document["session"]["comparison_windows"] = [{"from": 0, "to": 7}]
    document["session"]["bookmarks"][0]["colour"] = "amber"
    return json.dumps(document).encode()


def test_a_newer_schema_opens_read_only_and_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "from-the-future.xray"
    original = newer_schema_bytes(tmp_path)
    path.write_bytes(original)

    document = SessionDocument.open(path)

    assert document.read_only and "newer" in document.notices[0]
    assert "this version does not read what it stored at /session/bookmarks/0/colour, /session/comparison_windows;" in document.notices[0]
    assert document.session.bookmarks[0].note == "Q=1008 visual prefill: tiled reduction"
    document.session.add_bookmark(OpKey(1, "decode", 0, "sdpa"), "added while read-only")
    with pytest.raises(SessionReadOnlyError, match="newer"):
        document.save()
    plain = SessionDocument(document.session)
    with pytest.raises(SessionReadOnlyError, match="Save As"):
        plain.save_as(path)
    assert path.read_bytes() == original
    assert not (tmp_path / "from-the-future.xray.1").exists()

    document.save_as(tmp_path / "copy.xray")
    assert not document.read_only
    assert len(SessionDocument.open(tmp_path / "copy.xray").session.bookmarks) == 3


def test_a_newer_schema_this_version_cannot_read_is_refused_and_left_in_place(tmp_path: Path) -> None:
    path = tmp_path / "future.xray"
    path.write_text(json.dumps({"format": "parity-xray-session", "schema_version": 9, "saved_utc": "", "session": {"graph": []}}))
    (tmp_path / "future.xray.1").write_bytes(dumps(Investigation(title="older backup")))
    with pytest.raises(SessionOpenError, match="newer Parity X-ray"):
        SessionDocument.open(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.parametrize(
    ("mutate", "location", "problem"),
    [
        (lambda d: d["session"]["bookmarks"][0]["op"].pop("layer"), "/session/bookmarks/0/op/layer", "is missing"),
        (lambda d: d["session"]["captures"][0]["identity"].update(size="big"), "/session/captures/0/identity/size", "must be int"),
        (lambda d: d["session"].update(stray=1), "/session", "unknown key(s) stray"),
        (lambda d: d["session"]["alignment_overrides"][0]["left"].update(capture_id="ghost"), "/session/alignment_overrides/0", "'ghost'"),
        (lambda d: d.update(schema_version=0), "/schema_version", "positive integer"),
        (lambda d: d.update(format="something-else"), "/format", "not a Parity X-ray session"),
        (lambda d: d["session"].update(alignment_mode="tokens"), "/session/alignment_mode", "must be one of auto, calls, positions, not 'tokens'"),
        (lambda d: d["session"]["view"]["layout"].update(col_axis="x"), "/session/view/layout/col_axis", 'must be int, not "x"'),
        (lambda d: d["session"]["view"]["layout"].update(col_axis=None), "/session/view/layout/col_axis", "must be int, not null"),
        (lambda d: d["session"]["view"]["layout"].update(row_axis=-1), "/session/view/layout/row_axis", "must be at least 0, not -1"),
        (lambda d: d["session"]["view"]["layout"].update(tab="2"), "/session/view/layout/tab", "must be int"),
        (lambda d: d["session"]["view"]["layout"].update(window_state="abc"), "/session/view/layout/window_state", "is not base64 text"),
        (lambda d: d["session"]["bookmarks"][0]["view"]["layout"].update(col_axis=1.5), "/session/bookmarks/0/view/layout/col_axis", "must be int"),
    ],
)
def test_format_errors_name_the_place_and_the_problem(tmp_path: Path, mutate, location: str, problem: str) -> None:
    document = json.loads(dumps(full_session(tmp_path)))
    mutate(document)
    with pytest.raises(SessionFormatError) as caught:
        loads(json.dumps(document).encode(), "s.xray")
    assert caught.value.location == location
    assert problem in caught.value.problem


def test_bookmarks_and_notes_export_as_markdown(tmp_path: Path) -> None:
    session = full_session(tmp_path)
    tricky = session.add_bookmark(OpKey(0, "text-after", 1, "q`rope"), "")
    text = bookmarks_markdown(session)
    assert text.startswith("# Qwen3 head-chunked SDPA vs MTPLX oracle\n\nRows 3-8 move")
    assert "### `0:visual:0:sdpa` — " in text
    assert "Q=1008 visual prefill: tiled reduction" in text
    assert "### `3:decode:-1:logits`" in text
    assert f"``0:text-after:1:{tricky.op.op}``" in text
    assert "_(no note)_" in text
    assert "- paired `native: step 0 · visual · layer 0 · Qcur-0 #2` with `oracle-2: step 0 · visual · layer 0 · model.layers.0.self_attn.rope #0`: Qcur is named again after RoPE" in text
    assert f"- sdpa with head chunking off at `0:prefill:0:sdpa`: `{tmp_path / 'rerun.h5'}`" in text
    session.title = "Someone's session\n# Verdict: PARITY"
    assert bookmarks_markdown(session).startswith("# Someone's session\\n# Verdict: PARITY\n\n"), "a title keeps to its heading"


@pytest.mark.parametrize(
    ("text", "location", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "file", "not valid JSON (it nests deeper than a reader follows)"),
        ('{"format": "parity-xray-session", "schema_version": 3, "x": ' + "9" * 5000 + "}", "file",
         "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion"),
        ('{"format": "parity-xray-session", "format": "parity-xray-session", "schema_version": 3}', "file",
         "not valid JSON (key 'format' is given twice in one object)"),
        ('{"format": "parity-xray-session", "schema_version": 1, "saved_utc": "", "session": null}', "/session",
         "not a valid schema 1 session (AttributeError: 'NoneType' object has no attribute 'get')"),
    ],
)
def test_json_beyond_what_a_parser_reads_is_a_located_format_error(text: str, location: str, problem: str) -> None:
    with pytest.raises(SessionFormatError) as caught:
        loads(text.encode(), "s.xray")
    assert (caught.value.source, caught.value.location) == ("s.xray", location)
    assert caught.value.problem.startswith(problem)


@pytest.mark.parametrize(
    ("edit", "location", "problem"),
    [
        (lambda d: d["session"]["view"]["colour_scale"].update(vmin="NaN"), "/session/view/colour_scale/vmin", "holds NaN or an infinity"),
        (lambda d: d["session"]["view"]["layout"].update(zoom="1e999"), "/session/view/layout", "holds NaN or an infinity"),
        (lambda d: d["session"]["tolerances"]["default"].update(atol="9" * 400), "/session/tolerances/default/atol", "is too large a number (400 digits)"),
        (lambda d: d["session"]["bookmarks"].append(dict(d["session"]["bookmarks"][0])), "/session/bookmarks/2/id", "bookmark id"),
        (lambda d: d.update(extra=1), "/", "unknown key(s) extra"),
        (lambda d: d["session"]["bookmarks"][0]["op"].update(op="bogus_op"), "/session/bookmarks/0/op/op", "'bogus_op' is not a canonical op"),
        (lambda d: d["session"]["bookmarks"][0]["op"].update(step=2**63), "/session/bookmarks/0/op/step", "is 9223372036854775808; a capture's step is 0..2147483647"),
        (lambda d: d["session"]["captures"][0]["identity"].update(size=-1), "/session/captures/0/identity/size", "is -1; a file's size is at least 0"),
        (lambda d: d["session"]["captures"][0]["identity"].update(sha256="zz"), "/session/captures/0/identity/sha256", "is 'zz'; a SHA-256 is 64 lowercase hex digits"),
    ],
)
def test_numbers_no_save_could_write_back_and_a_bookmark_id_used_twice_are_refused_where_they_are(
    tmp_path: Path, edit, location: str, problem: str  # type: ignore[no-untyped-def]
) -> None:
    document = json.loads(dumps(full_session(tmp_path)))
    edit(document)
    text = json.dumps(document).replace('"NaN"', "NaN").replace('"1e999"', "1e999").replace('"' + "9" * 400 + '"', "9" * 400)
    with pytest.raises(SessionFormatError) as refused:
        loads(text.encode(), "s.xray")
    assert refused.value.location == location and refused.value.problem.startswith(problem), refused.value


def test_a_relative_policy_path_is_the_session_folders_for_the_window_as_for_report(tmp_path: Path) -> None:
    document = json.loads(dumps(full_session(tmp_path)))
    document["session"]["tolerances"]["policy"] = "policies/strict.toml"
    decoded = loads(json.dumps(document).encode(), str(tmp_path / "folder" / "s.xray"))
    assert decoded.session.tolerance_policy == tmp_path / "folder" / "policies" / "strict.toml"


"""The HTML report, Qt-free and headless: self-contained, every image a real PNG, the findings in it."""

from __future__ import annotations

import base64
import shutil
import struct
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sessions.capture.opening import open_capture
from sessions.commands import report as report_command
from sessions.compare.comparison import iter_compare
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.verdict import EXIT_FAILED
from sessions.investigation.model import Investigation, RecordRef, ViewState
from sessions.investigation.store import SessionDocument
from sessions.progress import run_to_end
from sessions.report.html_page import PNG_SIGNATURE, bits_of, png_data_uri, render_html
from tests.hand_captures import pair_session

pytestmark = pytest.mark.slow


def tiny_png(width: int, height: int) -> bytes:
    """A real RGB PNG written by hand (signature, IHDR, IDAT, IEND with CRCs)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes((x * 40 + y * 60) % 256 for x in range(width * 3)) for y in range(height))
    return PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def decode_png(data: bytes) -> tuple[int, int]:
    """Width and height after checking the signature, every chunk's CRC and that IDAT inflates to the image size."""
    assert data[:8] == PNG_SIGNATURE
    pos, idat, size = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
            size = (width, height, height * (1 + width * channels * depth // 8))
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert size is not None and len(zlib.decompress(idat)) == size[2]
    return size[0], size[1]


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.svgs = 0
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.sources.append(values.get("src") or "")
        if tag == "svg":
            self.svgs += 1
        if tag in ("link", "script") or (tag == "img" and not (values.get("src") or "").startswith("data:")):
            self.external.append(tag)


@pytest.fixture(scope="module")
def comparison(demo_pairs: dict[str, tuple[Path, Path]]):  # type: ignore[no-untyped-def]
    with open_capture(demo_pairs["swiglu-order"][0]) as native, open_capture(demo_pairs["swiglu-order"][1]) as oracle:
        return run_to_end(iter_compare(native, oracle))


def test_the_report_embeds_every_image_as_a_png_and_states_the_first_divergence(comparison) -> None:  # type: ignore[no-untyped-def]
    first = comparison.pairs[comparison.first_divergence]
    session = Investigation(title="swiglu order")
    mark = session.add_bookmark(first.key, "gate*up before silu <tiled>")
    session.add_bookmark(OpKey(0, "decode", 0, "sdpa"), "no screenshot for this one")
    html = render_html(comparison, session, {mark.id: tiny_png(7, 5)})

    parsed = Images()
    parsed.feed(html)
    assert parsed.external == [] and parsed.svgs == 1, "self-contained: no links, scripts or fetched images"
    assert len(parsed.sources) == 1
    for source in parsed.sources:
        head, _, payload = source.partition(",")
        assert head == "data:image/png;base64"
        assert decode_png(base64.b64decode(payload)) == (7, 5)
    sample = first.metrics.first_difference
    assert first.label in html and sample.native_hex in html and sample.oracle_hex in html
    assert bits_of(sample.native_hex) in html and bits_of(sample.oracle_hex) in html
    assert "gate*up before silu &lt;tiled&gt;" in html, "notes are escaped, kept as written"
    assert "Token parity" in html and "Worst ops" in html and "Execution contracts" in html


def test_a_bookmarks_slices_read_as_the_user_writes_them(comparison) -> None:  # type: ignore[no-untyped-def]
    """The page printed Python's tuples: `[3, (0, 16, None), (None, None, None)]`."""
    session = Investigation()
    session.add_bookmark(OpKey(0, "visual", 0, "ffn_act"), "a held row", ViewState((3, (0, 16, None), (None, None, None), (2, None, 4))))
    html = render_html(comparison, session, {})
    assert "slices [3, 0:16, :, 2::4]" in html and "(None, None, None)" not in html


def test_bits_keep_the_storage_width_and_only_pngs_are_embedded() -> None:
    assert bits_of("0x8000") == "1000 0000 0000 0000"
    assert bits_of("0x0001") == "0000 0000 0000 0001"
    with pytest.raises(ValueError, match="not a PNG"):
        png_data_uri(b"GIF89a....")


def test_headless_html_report_from_a_pair_and_from_a_session(tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = (Path(shutil.copy2(p, tmp_path / p.name)) for p in demo_pairs["swiglu-order"])
    parser = report_command.argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out = tmp_path / "pair.html"
    assert report_command.run(parser.parse_args([str(native), str(oracle), "--html", str(out)])) == EXIT_FAILED
    assert "DIVERGENCE: first diverged at" in out.read_text()

    session = pair_session(native, oracle, "from a session")
    session.add_bookmark(OpKey(0, "visual", 0, "ffn_act"), "the SwiGLU order")
    document = SessionDocument(session)
    document.save_as(tmp_path / "s.xray")
    out = tmp_path / "session.html"
    assert report_command.run(parser.parse_args(["--session", str(tmp_path / "s.xray"), "--html", str(out)])) == EXIT_FAILED
    text = out.read_text()
    assert "from a session" in text and "the SwiGLU order" in text and "No screenshot" in text

    shutil.copy2(demo_pairs["head-chunk"][1], oracle)
    assert report_command.run(parser.parse_args(["--session", str(tmp_path / "s.xray"), "--html", str(out)])) == report_command.EXIT_UNUSABLE
    assert "not the capture this session was saved with" in capsys.readouterr().err


def test_escape_sequences_in_a_sessions_title_note_and_override_never_reach_the_page_or_the_terminal(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    session = pair_session(native, oracle, "title\x1b[2J")
    session.add_bookmark(OpKey(0, "text-before", 0, "ffn_act"), "line one\nline two\x07")
    forged = RecordRef("native", RecordKey(0, "text-before", 0, "\x1b[31mnoSuch"))
    session.add_override("pair", forged, RecordRef("oracle", RecordKey(0, "text-before", 0, "model.layers.0.mlp.swiglu")), "\x1b[Hwipe")
    SessionDocument(session).save_as(tmp_path / "s.xray")
    parser = report_command.argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out = tmp_path / "session.html"
    assert report_command.run(parser.parse_args(["--session", str(tmp_path / "s.xray"), "--html", str(out), "--no-cache"])) == EXIT_FAILED
    page, printed = out.read_text(), capsys.readouterr().out
    assert "\x1b" not in page and "\x07" not in page and "\x1b" not in printed
    assert "title\\x1b[2J" in page and "line one\nline two\\x07" in page and "\\x1b[Hwipe" in page
    assert "could not be aligned, first at 0:text-before:0:\\x1b[31mnoSuch" in printed
    session.add_bookmark(OpKey(0, "text-before", 0, "ffn_act\x1b[31m"), "forged")
    SessionDocument(session).save_as(tmp_path / "forged.xray")
    assert report_command.run(parser.parse_args(["--session", str(tmp_path / "forged.xray"), "--no-cache"])) == 2
    refused = capsys.readouterr().err
    assert "'ffn_act\\x1b[31m' is not a canonical op" in refused and "\x1b" not in refused, "a bookmark on no canonical op is damage, said escaped"


def test_the_growth_plot_draws_at_most_two_points_per_pixel_column_and_marks_each_columns_worst_op(comparison) -> None:  # type: ignore[no-untyped-def]
    import dataclasses
    import re

    from sessions.report.html_page import FIGURE_WIDTH, growth_svg

    def drawn(svg: str) -> tuple[list[float], int]:
        points = re.search(r'<polyline points="([^"]*)"', svg)
        assert points is not None
        return [float(p.split(",")[1]) for p in points.group(1).split()], svg.count("<circle")

    few = comparison.error_growth
    heights, marks = drawn(growth_svg(comparison))
    assert len(heights) == len(few) and marks == sum(1 for p in few if p.max_ulp), "few ops: one point and one mark each"
    many = dataclasses.replace(comparison, pairs=list(comparison.pairs) * (4 * FIGURE_WIDTH // len(comparison.pairs) + 1))
    assert len(many.error_growth) > 2 * FIGURE_WIDTH
    tall, marked = drawn(growth_svg(many))
    assert len(tall) <= 2 * FIGURE_WIDTH and 0 < marked <= FIGURE_WIDTH
    assert min(tall) == min(heights) and max(tall) == max(heights), "the highest and lowest errors are still drawn"


def test_a_contract_finding_reads_in_words_in_the_text_and_on_the_page_and_as_its_code_in_the_json(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["attention-contract"]
    parser = report_command.argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out_html, out_json = tmp_path / "r.html", tmp_path / "r.json"
    report_command.run(parser.parse_args([str(native), str(oracle), "--html", str(out_html), "--json", str(out_json)]))
    text = capsys.readouterr().out
    said = "  0:visual:0:sdpa: kernel or contract differs: effective_contract_id: native 'attn.bf16.single_range' vs oracle 'attn.f32.tiled64x64'"
    assert said in text.split("Execution contracts", 1)[1].splitlines()
    assert "<td>kernel or contract differs</td>" in out_html.read_text() and "KERNEL_CONTRACT_MISMATCH" not in out_html.read_text()
    assert '"kind": "KERNEL_CONTRACT_MISMATCH"' in out_json.read_text()

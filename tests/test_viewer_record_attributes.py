"""A tree row's records with the raw HDF5 attributes their files store, as `silx view` shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.hand_captures import T, bf16_bits, write_capture
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints", "This plugin does not support raise")

WAIT_MS = 120_000


def _opened(qtbot: QtBot, tmp_path: Path, native: Path, oracle: Path) -> MainWindow:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    win.open_pair(native, oracle)
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    return win


def _attributes_of(qtbot: QtBot, win: MainWindow, row_label: str, expected_actions: list[str]):  # type: ignore[no-untyped-def]
    actions = win.tree.actions_at(win.tree.row_index(row_label))
    assert [a.text() for a in actions] == expected_actions
    actions[-1].trigger()
    qtbot.waitUntil(lambda: win.attributes_dialog is not None and win.attributes_dialog.isVisible(), timeout=WAIT_MS)
    return win.attributes_dialog


@pytest.mark.slow
def test_a_pairs_row_shows_both_records_index_rows_and_dataset_attributes(qtbot: QtBot, tmp_path: Path, demo_pairs: dict, artifacts_dir: Path) -> None:
    win = _opened(qtbot, tmp_path, *demo_pairs["swiglu-order"])

    dialog = _attributes_of(qtbot, win, "ffn_act", ["Break this pairing…", "HDF5 attributes…"])

    assert dialog.windowTitle() == "HDF5 attributes — 0:text-before:0:ffn_act"
    native, oracle = dialog.sides["native"], dialog.sides["oracle"]
    assert (native.index_value("name"), oracle.index_value("name")) == ("ffn_swiglu-0", "model.layers.0.mlp.swiglu")
    assert native.index_value("dtype") == oracle.index_value("dtype") == "bfloat16"
    assert int(native.index_value("offset") or -1) >= 0 and int(native.index_value("nbytes") or 0) > 0, "the demo writes packs"
    assert (native.value_of("(none)") or "").startswith("its pack holds no attributes for it")
    assert str(demo_pairs["swiglu-order"][0]) in native.heading.text()
    assert dialog.grab().save(str(artifacts_dir / "viewer-hdf5-attributes.png"))
    win.close()


def test_an_unaligned_records_row_shows_its_one_side_with_the_recorders_own_attributes(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    bits = bf16_bits([[1.0, 2.0], [3.0, 4.0]])
    sources = ["blk.0.ffn_norm.weight", "ffn_inp-0"]
    native = write_capture(tmp_path / "n.h5", "native", [
        T("attn_norm", bits, layer=0, dtype="bfloat16"),
        T("ffn_norm", bits, layer=0, dtype="bfloat16", kernel_id="RMS_NORM", attrs={"ggml_src": json.dumps(sources)}),
    ])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", bits, layer=0, dtype="bfloat16")])
    win = _opened(qtbot, tmp_path, native, oracle)

    dialog = _attributes_of(qtbot, win, "native: ffn_norm (step 0 prefill layer 0)", ["HDF5 attributes…"])

    assert list(dialog.sides) == ["native"]
    side = dialog.sides["native"]
    assert json.loads(side.value_of("ggml_src[] element 1") or "") == sources, "a packed record shows its element of the pack's table"
    assert (side.index_value("name"), side.index_value("kernel_id"), side.index_value("seq")) == ("ffn_norm", "RMS_NORM", "1")
    assert dialog.grab().save(str(artifacts_dir / "viewer-hdf5-attributes-unaligned.png"))
    win.close()

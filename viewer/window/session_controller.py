"""The window's saved investigation: File ▸ Save/Open Session, autosave, recovery, checks, export.

Everything a session holds is domain state in `sessions.investigation.model`; this controller only
moves it between the session and the widgets. Before any capture of a session is shown, its
identity is checked (a moved one is located, a changed one flagged and held back until the
user accepts it), and captures are opened only through `open_session_capture`, the gate that
checks identity on the very handle it returns. Questions to the user go through replaceable
callables, so tests answer them without a modal dialog.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from sessions.atomic_write import atomic_write_bytes
from sessions.capture.identity import CaptureIdentity, identity_of_capture
from sessions.capture.reader import Capture, Record
from sessions.compare.align import UnalignedRecord
from sessions.compare.comparison import CompareOptions, PairResult
from sessions.compare.key import OpKey, RecordKey
from sessions.investigation.bookmarks_markdown import bookmarks_markdown
from sessions.investigation.capture_gate import (
    CaptureState,
    CaptureStatus,
    accept_changed_capture,
    check_captures_progress,
    locate_capture,
    open_session_capture,
)
from sessions.investigation.model import (
    Bookmark,
    CaptureRef,
    ColourScale,
    Investigation,
    RecordRef,
    ViewState,
    overrides_for_pair,
)
from sessions.investigation.recovery import (
    Autosaver,
    RecoveryOffer,
    claim_recovery_offers,
)
from sessions.investigation.store import (
    SessionDocument,
    SessionOpenError,
    SessionSaveError,
    describe_os_error,
)
from sessions.progress import Progress, ProgressGenerator
from sessions.report.html_page import render_html
from viewer import comparison_view as cv
from viewer.tensor.tensor_loader import SliceSpec

if TYPE_CHECKING:
    from viewer.window.main_window import MainWindow

AUTOSAVE_TICK_MS = 1000
CaptureChooser = Callable[[CaptureStatus], "Path | None"]
PathChooser = Callable[[str], "Path | None"]
"""Given 'open', 'save' or 'export-md'/'export-html', a path or None (cancelled)."""
CloseQuestion = Callable[[], str]
"""'save', 'discard' or 'cancel' for a session with unsaved work."""

FILTERS = {
    "open": "Parity X-ray sessions (*.xray)",
    "save": "Parity X-ray sessions (*.xray)",
    "export-md": "Markdown (*.md)",
    "export-html": "HTML report (*.html)",
}


def ask_path(parent: QWidget, purpose: str) -> Path | None:
    if purpose == "open":
        name, _ = QFileDialog.getOpenFileName(parent, "Open session", "", FILTERS[purpose])
    else:
        name, _ = QFileDialog.getSaveFileName(parent, "Save session as" if purpose == "save" else "Export", "", FILTERS[purpose])
    return Path(name) if name else None


def ask_capture(parent: QWidget, status: CaptureStatus) -> Path | None:
    start = str(status.candidate or status.path.parent)
    name, _ = QFileDialog.getOpenFileName(parent, f"Locate the {status.role} capture {status.path.name}", start, "Captures (*.h5 *.hdf5 *.capture);;All files (*)")
    return Path(name) if name else None


def ask_close(parent: QWidget) -> str:
    answer = QMessageBox.question(
        parent, "Unsaved session", "The session has unsaved bookmarks or changes. Save it before closing?",
        QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
    )
    return {QMessageBox.StandardButton.Save: "save", QMessageBox.StandardButton.Discard: "discard"}.get(answer, "cancel")


def iter_identities(captures: list[Capture]) -> ProgressGenerator[list[CaptureIdentity]]:
    identities = []
    for i, capture in enumerate(captures):
        yield Progress(i, len(captures), f"fingerprinting {capture.path.name}")
        identities.append(identity_of_capture(capture))
    return identities


def iter_open_session_captures(session: Investigation) -> ProgressGenerator[list[Capture]]:
    """The session's native and oracle, each through the identity gate."""
    refs = [session.captures_of("native")[0], session.captures_of("oracle")[0]]
    opened: list[Capture] = []
    try:
        for i, ref in enumerate(refs):
            yield Progress(i, len(refs), f"opening {ref.path.name}")
            opened.append(open_session_capture(ref))
    except BaseException:
        for capture in opened:
            capture.close()
        raise
    return opened


def iter_call(label: str, work: Callable[[], Any]) -> ProgressGenerator[Any]:
    yield Progress(0, 1, label)
    return work()


def view_state_of(spec: SliceSpec | None, scale: str, layout: dict[str, Any]) -> ViewState:
    """Shown axes become open ranges; held axes their index; which axis is rows is in the layout."""
    if spec is None:
        return ViewState(colour_scale=ColourScale(mode=scale), layout=layout)
    slices = tuple((None, None, None) if axis in (spec.row_axis, spec.col_axis) else index for axis, index in enumerate(spec.index))
    return ViewState(slices, ColourScale(mode=scale), {**layout, "row_axis": spec.row_axis, "col_axis": spec.col_axis})


def slice_spec_of(view: ViewState, ndim: int) -> SliceSpec | None:
    if len(view.slices) != ndim or "col_axis" not in view.layout:
        return None
    index = tuple(s if isinstance(s, int) else 0 for s in view.slices)
    row, col = view.layout.get("row_axis"), int(view.layout["col_axis"])
    return SliceSpec(None if row is None else int(row), col, index)


def _record(capture: Capture, seq: int) -> Record:
    """The record a comparison row names by seq (rows come from this very capture)."""
    return next(r for r in capture.records if r.seq == seq)


class SessionController(QObject):
    document_changed = Signal()
    """A different session is open, or its saved/dirty state changed (title bar)."""
    restored = Signal()
    """A session's pair is compared and its selection and view are applied."""
    exported = Signal(object)
    """Path of a finished export."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.recovery_dir = window.settings.recovery_dir()
        self.choose_path: PathChooser = lambda purpose: ask_path(window, purpose)
        self.choose_capture: CaptureChooser = lambda status: ask_capture(window, status)
        self.ask_close: CloseQuestion = lambda: ask_close(window)
        self.document = SessionDocument(Investigation())
        self.autosaver = Autosaver(self.document, self.recovery_dir)
        self._restoring = False
        self._pending: Investigation | None = None
        self._screenshots: dict[str, bytes] = {}
        self._export_queue: list[Bookmark] = []
        self._export_path: Path | None = None
        self._export_selected: Any = None
        self._awaiting_shot = False
        self.timer = QTimer(self)
        self.timer.setInterval(AUTOSAVE_TICK_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        window.bookmarks.set_session(self.document.session)

    def connect_window(self) -> None:
        """Follow the window's model; called after the window's own handlers are connected, so a
        restored selection is applied after (not overwritten by) the jump to the first divergence."""
        window, model = self.window, self.window.model
        model.captures_changed.connect(self._captures_changed)
        model.comparison_changed.connect(self._comparison_changed)
        model.selection_changed.connect(self._selection_changed)
        model.scale_changed.connect(lambda _s: self._record_view())
        window.tabs.currentChanged.connect(lambda _i: self._record_view())
        window.tensor_view.slice_shown.connect(self._slice_shown)
        window.bookmarks.add_requested.connect(self.add_bookmark)
        window.bookmarks.jump_requested.connect(self.show_bookmark)
        window.dispatch.rerun_saved.connect(self._rerun_saved)
        window.tree.break_requested.connect(self.break_pairing)
        window.tree.pair_requested.connect(self.pair_records)

    @property
    def session(self) -> Investigation:
        return self.document.session

    # -- the document ------------------------------------------------------------------------

    def _install(self, document: SessionDocument) -> None:
        self.autosaver.close()
        self.document = document
        self.autosaver = Autosaver(document, self.recovery_dir)
        self.window.bookmarks.set_session(document.session)
        self.document_changed.emit()

    def _tick(self) -> None:
        was_dirty = self.document.dirty
        self.autosaver.tick()
        if self.autosaver.last_error:
            self.window.statusBar().showMessage(self.autosaver.last_error, 5000)
        if was_dirty != self.document.dirty:
            self.document_changed.emit()

    def worth_keeping(self) -> bool:
        """Unsaved work a user would miss: notes and bookmarks, or edits to a saved session."""
        s = self.session
        return self.document.dirty and bool(s.bookmarks or s.title or s.summary or self.document.path is not None)

    def _settle_unsaved(self) -> bool:
        """Before the session is replaced or the window closes: False when the user cancelled."""
        if not self.worth_keeping():
            return True
        answer = self.ask_close()
        if answer == "save":
            return self.save()
        return answer == "discard"

    def close(self) -> bool:
        if not self._settle_unsaved():
            return False
        self.timer.stop()
        self.autosaver.close()
        return True

    # -- save --------------------------------------------------------------------------------

    def save(self) -> bool:
        if self.document.path is None or self.document.read_only:
            return self.save_as()
        return self._write(None)

    def save_as(self) -> bool:
        path = self.choose_path("save")
        if path is None:
            return False
        if path.suffix != ".xray":
            path = path.with_name(path.name + ".xray")
        return self._write(path)

    def _write(self, path: Path | None) -> bool:
        self._record_view(with_layout=True)
        try:
            self.document.save() if path is None else self.document.save_as(path)
        except SessionSaveError as exc:
            self.window.banners.show_message("session", "error", str(exc))
            return False
        assert self.document.path is not None
        self.window.banners.clear("session")
        self.window.settings.add_recent_session(self.document.path)
        self.window.rebuild_recent_sessions()
        self.autosaver.tick()
        self.window.statusBar().showMessage(f"Session saved to {self.document.path}", 5000)
        self.document_changed.emit()
        return True

    # -- open --------------------------------------------------------------------------------

    def open_dialog(self) -> None:
        path = self.choose_path("open")
        if path is not None:
            self.open_session(path)

    def open_session(self, path: str | Path) -> bool:
        if not self._settle_unsaved():
            return False
        self.window.banners.clear("session")
        try:
            document = SessionDocument.open(path)
        except SessionOpenError as exc:
            self.window.banners.show_message("session", "error", str(exc))
            return False
        self._install(document)
        for notice in document.notices:
            self.window.banners.show_message("session", "warning", notice)
        self.window.settings.add_recent_session(Path(path))
        self.window.rebuild_recent_sessions()
        self.load_captures()
        return True

    def load_captures(self) -> None:
        """Check every capture the session names, then show its pair (or ask about the ones in the way)."""
        session, folder = self.session, self.document.path.parent if self.document.path else None
        if not (session.captures_of("native") and session.captures_of("oracle")):
            self.window.banners.show_message("session", "info", "This session names no native/oracle pair yet; open captures to start.")
            return
        self.window.tasks.submit(
            "session",
            lambda: check_captures_progress(session, folder),
            on_success=self._checked,
            on_failure=lambda message: self.window.banners.show_message("session", "error", f"Could not check the session's captures: {message}"),
        )

    def _checked(self, statuses: list[CaptureStatus]) -> None:
        self.window.banners.clear("captures-check")
        blocking = [s for s in statuses if not s.usable and s.role in ("native", "oracle")]
        for status in statuses:
            if status.usable:
                continue
            self._flag(status)
        if not blocking:
            self._open_pair()

    def _flag(self, status: CaptureStatus) -> None:
        banners = self.window.banners
        if status.state is CaptureState.MISSING:
            where = f" It looks like it is at {status.candidate}." if status.candidate else ""
            banners.show_message("captures-check", "warning", f"The {status.role} capture {status.message}.{where}",
                                 actions=[("Locate…", lambda: self.locate(status))])
        elif status.state is CaptureState.CHANGED:
            banners.show_message("captures-check", "error", f"The {status.role} capture changed: {status.message}.",
                                 actions=[("Accept this file", lambda: self.accept(status)), ("Locate the original…", lambda: self.locate(status))])
        else:
            banners.show_message("captures-check", "error", f"The {status.role} capture cannot be read: {status.message}",
                                 actions=[("Locate…", lambda: self.locate(status))])

    def locate(self, status: CaptureStatus) -> None:
        path = self.choose_capture(status)
        if path is None:
            self._flag(status)
            return
        session = self.session
        self.window.tasks.submit("session", lambda: iter_call(f"checking {path.name}", lambda: locate_capture(session, status.capture_id, path)),
                                 on_success=self._located, on_failure=lambda m: self.window.banners.show_message("captures-check", "error", m))

    def _located(self, status: CaptureStatus) -> None:
        if status.usable:
            self.load_captures()
        else:
            self._flag(status)

    def accept(self, status: CaptureStatus) -> None:
        session = self.session
        self.window.tasks.submit("session", lambda: iter_call("accepting", lambda: accept_changed_capture(session, status.capture_id, status.path)),
                                 on_success=lambda _s: self.load_captures(), on_failure=lambda m: self.window.banners.show_message("captures-check", "error", m))

    def _open_pair(self) -> None:
        session = self.session
        self._restoring = True
        self._pending = session
        self.window.tasks.submit(
            "open",
            lambda: iter_open_session_captures(session),
            on_success=lambda captures: self.window.opened(captures, explicit=True),
            on_failure=self._gate_refused,
        )

    def _gate_refused(self, message: str) -> None:
        self._restoring = False
        self.window.banners.show_message("captures-check", "error", f"Not shown: {message}")

    # -- following the window ----------------------------------------------------------------

    def compare_options(self, base: CompareOptions) -> CompareOptions:
        """The session's tolerance, its profiles for captures it names (0 / "" = bit-exact / detect),
        and its alignment overrides between the two open captures."""
        tol = self.session.tolerance
        refs = self._session_refs()
        profiles = {role: ref.profile or None for role, ref in refs.items()}
        overrides = overrides_for_pair(self.session.overrides, refs["native"].id, refs["oracle"].id) if len(refs) == 2 else ()
        return replace(
            base,
            atol=tol.atol or None, rtol=tol.rtol or None, max_ulp=tol.max_ulp or None,
            native_profile=profiles.get("native") or base.native_profile,
            oracle_profile=profiles.get("oracle") or base.oracle_profile,
            overrides=overrides,
        )

    # -- manual alignment --------------------------------------------------------------------

    def break_pairing(self, pair: PairResult, reason: str) -> bool:
        """Record the user's break in the session and compare again with it."""
        return self._override("unpair", pair.native_seq, pair.oracle_seq, reason)

    def pair_records(self, native: UnalignedRecord, oracle: UnalignedRecord, reason: str) -> bool:
        """Record the user's pairing in the session and compare again with it."""
        return self._override("pair", native.seq, oracle.seq, reason)

    def _override(self, action: str, native_seq: int, oracle_seq: int, reason: str) -> bool:
        model, refs = self.window.model, self._session_refs()
        if len(refs) != 2 or model.native is None or model.oracle is None:
            self.window.banners.show_message("session", "warning", "The open captures are not recorded in the session yet; try again in a moment.")
            return False
        native, oracle = _record(model.native, native_seq), _record(model.oracle, oracle_seq)
        self.session.add_override(
            action, RecordRef(refs["native"].id, RecordKey.of(native)), RecordRef(refs["oracle"].id, RecordKey.of(oracle)), reason
        )
        self.window.start_compare()
        return True

    def _session_refs(self) -> dict[str, CaptureRef]:
        """The session's reference for each open capture (by role and path), where it names it."""
        model, found = self.window.model, {}
        for role, capture in (("native", model.native), ("oracle", model.oracle)):
            ref = next((r for r in self.session.captures_of(role) if capture is not None and r.path == capture.path.absolute()), None)
            if ref is not None:
                found[role] = ref
        return found

    def _record_profiles(self) -> None:
        viewed = self.window.model.comparison
        if viewed is None:
            return
        detected = {"native": viewed.comparison.native_profile, "oracle": viewed.comparison.oracle_profile}
        for role, ref in self._session_refs().items():
            if not ref.profile:
                self.session.set_profile(ref.id, detected[role])

    def _captures_changed(self) -> None:
        model = self.window.model
        if self._restoring or not model.has_pair:
            return
        captures = [model.native, model.oracle]
        self.window.tasks.submit("identity", lambda: iter_identities(captures), on_success=lambda ids: self._record_captures(captures, ids),
                                 on_failure=lambda m: self.window.banners.show_message("session", "warning", f"The captures cannot be recorded in the session: {m}"))

    def _record_captures(self, captures: list[Capture], identities: list[CaptureIdentity]) -> None:
        if [self.window.model.native, self.window.model.oracle] != captures:
            return
        session = self.session
        for role, capture, identity in zip(("native", "oracle"), captures, identities):
            old = session.captures_of(role)
            if old and old[0].path == capture.path.absolute() and old[0].identity.same_content(identity):
                continue
            for ref in old:
                try:
                    session.remove_capture(ref.id)
                except ValueError as exc:
                    self.window.banners.show_message("session", "warning", str(exc))
            session.add_capture(role, capture.path, identity)
        self._record_profiles()

    def _comparison_changed(self) -> None:
        viewed = self.window.model.comparison
        if viewed is None:
            return
        self._record_profiles()
        if self._restoring:
            self._apply_restored()

    def _apply_restored(self) -> None:
        session = self._pending or self.session
        self._restoring, self._pending = False, None
        view = session.view
        if view.colour_scale.mode in ("absolute", "relative", "ULP"):
            self.window.model.set_scale(view.colour_scale.mode)
        state = view.layout.get("window_state")
        if isinstance(state, str):
            self.window.restoreState(QByteArray(base64.b64decode(state)))
        tab = view.layout.get("tab")
        if isinstance(tab, int) and 0 <= tab < self.window.tabs.count():
            self.window.tabs.setCurrentIndex(tab)
        if session.selected_op is not None:
            self._select(session.selected_op, view)
        self.restored.emit()

    def _select(self, op: OpKey, view: ViewState | None) -> bool:
        pair = cv.find_pair(self.window.model.comparison, op)
        if pair is None:
            self.window.banners.show_message("session", "warning", f"{op.label()} is not in this comparison.")
            return False
        self.window.model.select(pair)
        spec = slice_spec_of(view, len(pair.metrics.shape)) if view is not None else None
        if spec is not None:
            self.window.load_slice(spec)
        return True

    def _selection_changed(self, pair: Any) -> None:
        if pair is None or self._restoring:
            return
        op = pair.key
        if op != self.session.selected_op:
            self.session.select_op(op)

    def _slice_shown(self) -> None:
        self._record_view()
        if self._awaiting_shot:
            self._awaiting_shot = False
            self._shoot_next()

    def current_view(self, with_layout: bool = False) -> ViewState:
        data = self.window.tensor_view.data
        layout: dict[str, Any] = {"tab": self.window.tabs.currentIndex()}
        if with_layout:
            layout["window_state"] = base64.b64encode(bytes(self.window.saveState())).decode("ascii")
        elif "window_state" in self.session.view.layout:
            layout["window_state"] = self.session.view.layout["window_state"]
        return view_state_of(None if data is None else data.spec, self.window.model.scale, layout)

    def _record_view(self, with_layout: bool = False) -> None:
        if self._restoring:
            return
        view = self.current_view(with_layout)
        if view != self.session.view:
            self.session.set_view(view)

    def _rerun_saved(self, path: Path, identity: CaptureIdentity, key: str) -> None:
        op = OpKey.parse(key)
        self.session.add_rerun(path, identity, description=f"live rerun of {key} through MLX", op=op)

    # -- bookmarks ---------------------------------------------------------------------------

    def add_bookmark(self, note: str = "") -> Bookmark | None:
        pair = self.window.model.selected
        if pair is None:
            self.window.statusBar().showMessage("Select an op first, then bookmark it.", 5000)
            return None
        bookmark = self.session.add_bookmark(pair.key, note, self.current_view())
        self.window.bookmarks.select_bookmark(bookmark.id)
        self.window.bookmarks_dock.show()
        self.window.bookmarks.note.setFocus()
        return bookmark

    def show_bookmark(self, bookmark: Bookmark) -> bool:
        view = bookmark.view
        if view is not None and view.colour_scale.mode in ("absolute", "relative", "ULP"):
            self.window.model.set_scale(view.colour_scale.mode)
        self.window.show_panel(0)
        return self._select(bookmark.op, view)

    # -- recovery ----------------------------------------------------------------------------

    def offer_recovery(self) -> list[RecoveryOffer]:
        """Sessions left by a crashed or killed Parity X-ray, each offered once, in a banner."""
        scan = claim_recovery_offers(self.recovery_dir)
        for notice in scan.notices:
            self.window.banners.show_message("recovery", "warning", notice)
        for offer in scan.offers:
            name = offer.session_path.name if offer.session_path else "an unsaved session"
            what = f"{len(offer.session.bookmarks)} bookmark(s)" + (f", “{offer.session.title}”" if offer.session.title else "")
            self.window.banners.show_message(
                "recovery", "warning",
                f"Parity X-ray stopped unexpectedly while {name} had unsaved work ({what}). Restore it?",
                closable=False,
                actions=[("Restore", lambda o=offer: self.restore(o)), ("Discard", offer.discard)],
            )
        return scan.offers

    def restore(self, offer: RecoveryOffer) -> None:
        document = offer.restore()
        self._install(document)
        self.autosaver.flush()
        offer.discard()
        self.window.statusBar().showMessage("Recovered the unsaved session; save it to keep it.", 8000)
        self.load_captures()

    # -- export ------------------------------------------------------------------------------

    def export_markdown(self, path: Path | None = None) -> bool:
        path = path or self.choose_path("export-md")
        if path is None:
            return False
        return self._export_bytes(path, bookmarks_markdown(self.session).encode("utf-8"))

    def _export_bytes(self, path: Path, data: bytes) -> bool:
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            self.window.banners.show_message("session", "error", f"Could not write {path}: {describe_os_error(exc)}. The session is unchanged.")
            return False
        self.window.statusBar().showMessage(f"Exported {path}", 5000)
        self.exported.emit(path)
        return True

    def export_html(self, path: Path | None = None) -> bool:
        """Grab each bookmark's view (restored as it was marked), then write the report."""
        path = path or self.choose_path("export-html")
        if path is None:
            return False
        if self.window.model.comparison is None:
            self.window.banners.show_message("session", "error", "Open and compare a pair before exporting the HTML report.")
            return False
        self._export_path, self._screenshots = path, {}
        self._export_queue = [b for b in self.session.bookmarks]
        self._export_selected = self.window.model.selected
        self._next_bookmark()
        return True

    def _next_bookmark(self) -> None:
        while self._export_queue:
            bookmark = self._export_queue[0]
            self._awaiting_shot = True
            if not self.show_bookmark(bookmark):
                self._awaiting_shot = False
                self._export_queue.pop(0)
                continue
            if self._awaiting_shot and self.window.tasks.task("tensor") is None:
                self._awaiting_shot = False
                self._shoot_next()
            return
        self._finish_export()

    def _shoot_next(self) -> None:
        bookmark = self._export_queue.pop(0)
        image = self.window.tensor_view.grab()
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")
        buffer.close()
        self._screenshots[bookmark.id] = bytes(data)
        QTimer.singleShot(0, self._next_bookmark)

    def _finish_export(self) -> None:
        path, self._export_path = self._export_path, None
        viewed = self.window.model.comparison
        if path is None or viewed is None:
            return
        if self._export_selected is not None:
            self.window.model.select(self._export_selected)
        html = render_html(viewed.comparison, self.session, self._screenshots)
        self._export_bytes(path, html.encode("utf-8"))

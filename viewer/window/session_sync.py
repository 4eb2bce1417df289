"""Keeping the open investigation in step with what the window shows.

The session records the open captures (by path and identity), their profiles, the selected op,
the view (slice, colour scale, panel, dock layout), bookmarks, reruns and alignment overrides;
a restored session puts its selection and view back once its pair is compared. The comparison
takes the session's tolerance, tolerance policy, profiles and overrides through `compare_options`;
a new tolerance (`set_tolerance`) is recorded and compared again, as an override is. This part
follows the `PairModel` and changes the view only through the callables in `WindowView`, so it
never needs the window itself.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from sessions.capture.identity import CaptureIdentity, identity_of_capture
from sessions.capture.reader import Capture
from sessions.compare.align_modes import AUTO
from sessions.compare.comparison import PairResult
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.options import CompareOptions
from sessions.compare.tolerance_policy import load_policy, with_op_rules
from sessions.compare.unaligned import UnalignedRecord
from sessions.investigation.model import (
    Bookmark,
    CaptureRef,
    ColourScale,
    Investigation,
    RecordRef,
    SavedTolerance,
    ViewState,
    overrides_for_pair,
)
from sessions.progress import Progress, ProgressGenerator
from viewer import comparison_view as cv
from viewer.pair_model import COLOUR_SCALES, PairModel
from viewer.tensor.tensor_loader import SliceSpec
from viewer.widgets.banner import BannerArea
from viewer.window.session_file import StatusMessage
from viewer.workers import TaskSlots

MISSING_OP = "missing-op"
"""The banner group of "X is not in this comparison": true of one comparison only."""


@dataclass(frozen=True)
class WindowView:
    """What of the window's view a session keeps and restores, as plain callables."""

    panel: Callable[[], int]
    """Index of the panel (tab) shown."""
    show_panel: Callable[[int], None]
    shown_slice: Callable[[], "SliceSpec | None"]
    """The slice the tensor view shows, None when it shows none."""
    load_slice: Callable[[SliceSpec], None]
    save_layout: Callable[[], bytes]
    """The docks' and toolbars' arrangement (QMainWindow.saveState)."""
    restore_layout: Callable[[bytes], None]


def iter_identities(captures: list[Capture]) -> ProgressGenerator[list[CaptureIdentity]]:
    identities = []
    for i, capture in enumerate(captures):
        yield Progress(i, len(captures), f"fingerprinting {capture.path.name}")
        identities.append(identity_of_capture(capture))
    return identities


def view_state_of(spec: SliceSpec | None, scale: str, layout: dict[str, Any]) -> ViewState:
    """Shown axes become open ranges; held axes their index; which axis is rows is in the layout."""
    if spec is None:
        return ViewState(colour_scale=ColourScale(mode=scale), layout=layout)
    slices = tuple((None, None, None) if axis in (spec.row_axis, spec.col_axis) else index for axis, index in enumerate(spec.index))
    return ViewState(slices, ColourScale(mode=scale), {**layout, "row_axis": spec.row_axis, "col_axis": spec.col_axis})


def slice_spec_of(view: ViewState, ndim: int) -> SliceSpec | None:
    """The saved slice, when it fits a tensor of `ndim` axes (the session schema checked its types)."""
    row, col = view.layout.get("row_axis"), view.layout.get("col_axis")
    if len(view.slices) != ndim or col is None or col >= ndim or row is not None and row >= ndim:
        return None
    index = tuple(s if isinstance(s, int) else 0 for s in view.slices)
    return SliceSpec(row, col, index)


class SessionSync(QObject):
    restored = Signal()
    """A session's pair is compared and its selection and view are applied."""
    bookmark_added = Signal(object)
    """The Bookmark the user just added (its note is edited next)."""

    def __init__(
        self,
        session: Callable[[], Investigation],
        model: PairModel,
        tasks: TaskSlots,
        banners: BannerArea,
        view: WindowView,
        recompare: Callable[[], None],
        status: StatusMessage,
        parent: QWidget,
    ) -> None:
        """Connect after the window's own handlers of `model`, so a restored selection is
        applied after (not overwritten by) the window's jump to the first finding."""
        super().__init__(parent)
        self._model = model
        self._tasks = tasks
        self._banners = banners
        self._view = view
        self._recompare = recompare
        self._status = status
        self._current = session
        self._restoring = False
        self._pending: Investigation | None = None
        self._chosen: set[tuple[int, str]] = set()
        """(id of a session, what its user chose in this window though it is the default): `_chose`."""
        model.captures_changed.connect(self._captures_changed)
        model.comparison_changed.connect(self._comparison_changed)
        model.selection_changed.connect(self._selection_changed)
        model.scale_changed.connect(lambda _s: self.record_view())

    @property
    def session(self) -> Investigation:
        """The investigation open now (another one may take its place at any time)."""
        return self._current()

    # -- restoring a saved session -----------------------------------------------------------

    def expect_restore(self, session: Investigation) -> None:
        """The session's pair is being opened: apply its selection and view once it is compared."""
        self._restoring, self._pending = True, session

    def restore_refused(self) -> None:
        self._restoring, self._pending = False, None

    def _apply_restored(self) -> None:
        """Put the saved view back, still restoring meanwhile: each step (the colour scale, the
        panel) recorded the view half put back, so a session reopened and not touched was dirty."""
        session = self._pending or self.session
        view = session.view
        if view.colour_scale.mode in COLOUR_SCALES:
            self._model.set_scale(view.colour_scale.mode)
        state = view.layout.get("window_state")
        if isinstance(state, str):
            self._view.restore_layout(base64.b64decode(state))
        tab = view.layout.get("tab")
        if isinstance(tab, int):
            self._view.show_panel(tab)
        if session.selected_op is not None:
            self._select(session.selected_op, view)
        self._restoring, self._pending = False, None
        self.restored.emit()

    # -- the pair and its comparison ---------------------------------------------------------

    def pair_paths(self) -> set[Path]:
        """The native and oracle paths the session names (empty when it names no capture yet)."""
        return {ref.path for role in ("native", "oracle") for ref in self.session.captures_of(role)}

    def compare_options(self, base: CompareOptions) -> CompareOptions:
        """The session's tolerance and policy, its profiles for captures it names (0 / "" = bit-exact
        / detect), its alignment mode, and its alignment overrides between the two open captures;
        a tolerance or mode the session never chose is `base`'s.

        The policy file is read again each time, as `report --tolerance-policy` reads it: an
        edited policy counts at the next comparison. PolicyError (naming the file and the
        problem) when it cannot be used."""
        tol = self.session.tolerance
        policy = self.session.tolerance_policy
        refs = self._session_refs()
        profiles = {role: ref.profile or None for role, ref in refs.items()}
        overrides = overrides_for_pair(self.session.overrides, refs["native"].id, refs["oracle"].id) if len(refs) == 2 else ()
        judged = base
        if self._chose("tolerance"):
            judged = replace(
                base,
                atol=tol.atol, rtol=tol.rtol, max_ulp=tol.max_ulp,
                policy=with_op_rules(None if policy is None else load_policy(policy), self.session.op_bounds(), "the session"),
            )
        return replace(
            judged,
            native_profile=profiles.get("native") or base.native_profile,
            oracle_profile=profiles.get("oracle") or base.oracle_profile,
            overrides=overrides,
            alignment=self.session.alignment_mode if self._chose("alignment") else base.alignment,
        )

    def _chose(self, what: str) -> bool:
        """Whether the session holds its own `what` ("tolerance", "alignment"): set by the user in
        this window, or saved in it. One it never chose leaves the window's starting options (a
        gate case's), and bit-exact or automatic chosen by the user count though they are defaults."""
        session = self.session
        if what == "tolerance":
            saved = session.tolerance != SavedTolerance() or session.tolerance_policy is not None or bool(session.op_bounds())
        else:
            saved = session.alignment_mode != AUTO
        return saved or (id(session), what) in self._chosen

    def tolerance_in_force(self, base: CompareOptions) -> tuple[SavedTolerance, Path | None]:
        """The tolerance and policy file the pair is judged by: the session's when it chose them,
        else `base`'s (the Tolerance dialog showed bit-exact beside a gate case's max ULP 1)."""
        if self._chose("tolerance"):
            return self.session.tolerance, self.session.tolerance_policy
        return SavedTolerance(base.max_ulp or 0, base.atol or 0.0, base.rtol or 0.0), None if base.policy is None else Path(base.policy.source)

    def _session_refs(self) -> dict[str, CaptureRef]:
        """The session's reference for each open capture, by path: of its role, else of the other
        one (the roles were just swapped, and the session learns it only after the comparison
        has started, which must still apply the pairings made by hand)."""
        found = {}
        for role, capture in (("native", self._model.native), ("oracle", self._model.oracle)):
            if capture is None:
                continue
            named = self._refs_of(capture)
            ref = next((r for r in named if r.role == role), named[0] if named else None)
            if ref is not None:
                found[role] = ref
        return found

    def _refs_of(self, capture: Capture) -> list[CaptureRef]:
        """The session's native and oracle references to `capture`'s file, whatever their role."""
        return [r for r in self.session.captures if r.role in ("native", "oracle") and r.path == capture.path.absolute()]

    def _record_profiles(self) -> None:
        viewed = self._model.comparison
        if viewed is None:
            return
        detected = {"native": viewed.comparison.native_profile, "oracle": viewed.comparison.oracle_profile}
        for role, ref in self._session_refs().items():
            if not ref.profile:
                self.session.set_profile(ref.id, detected[role])

    def _captures_changed(self) -> None:
        model = self._model
        if self._restoring or not model.has_pair:
            return
        captures = [model.native, model.oracle]
        self._tasks.submit("identity", lambda: iter_identities(captures), on_success=lambda ids: self._record_captures(captures, ids),
                           on_failure=lambda m: self._banners.show_message("session", "warning", f"The captures cannot be recorded in the session: {m}"))

    def _record_captures(self, captures: list[Capture], identities: list[CaptureIdentity]) -> None:
        if [self._model.native, self._model.oracle] != captures:
            return
        session = self.session
        for role, capture, identity in zip(("native", "oracle"), captures, identities):
            old = session.captures_of(role)
            if old and old[0].path == capture.path.absolute() and old[0].identity.same_content(identity):
                continue
            swapped = next((ref for ref in self._refs_of(capture) if ref.role != role and ref.identity.same_content(identity)), None)
            if swapped is not None:  # the roles were swapped: the same capture, with its overrides, takes the other role
                session.set_role(swapped.id, role)
                continue
            for ref in old:
                try:
                    session.remove_capture(ref.id)
                except ValueError as exc:
                    self._banners.show_message("session", "warning", str(exc))
            session.add_capture(role, capture.path, identity)
        self._record_profiles()

    def _comparison_changed(self) -> None:
        if self._model.comparison is None:
            if self._model.not_compared is not None:
                # No comparison is coming (cancelled, failed, a policy unusable) to apply a restored
                # session's view to: left expecting one, the window recorded no later pair in its
                # session and gave the next pair the old selection.
                self.restore_refused()
            return
        self._record_profiles()
        if self._restoring:
            self._apply_restored()

    def set_tolerance(self, tolerance: SavedTolerance, policy: Path | None) -> None:
        """Record the user's tolerance and policy file in the session and compare again with them."""
        session = self.session
        self._chosen.add((id(session), "tolerance"))
        if tolerance != session.tolerance:
            session.set_tolerance(tolerance)
        if policy != session.tolerance_policy:
            session.set_tolerance_policy(policy)
        self._recompare()

    def keep_options(self, judged: CompareOptions) -> None:
        """Before a save: the tolerance, policy file and pairing the pair is compared with, where
        the session never chose its own (a gate case's window): saved without them, the session
        reopened, or given to `report --session`, said DIVERGENCE of a case the gate passed."""
        session = self.session
        if not self._chose("tolerance"):
            session.set_tolerance(SavedTolerance(judged.max_ulp or 0, judged.atol or 0.0, judged.rtol or 0.0))
            session.set_tolerance_policy(Path(judged.policy.source) if judged.policy is not None else None)
            self._chosen.add((id(session), "tolerance"))
        if not self._chose("alignment"):
            session.set_alignment_mode(judged.alignment)
            self._chosen.add((id(session), "alignment"))

    def set_alignment_mode(self, mode: str) -> None:
        """Record how the user pairs records (`report --align`) and compare again, when it changed
        or is chosen for the first time (automatic, chosen over a gate case's pairing)."""
        first = not self._chose("alignment")
        self._chosen.add((id(self.session), "alignment"))
        if mode != self.session.alignment_mode:
            self.session.set_alignment_mode(mode)
            self._recompare()
        elif first:
            self._recompare()

    # -- manual alignment --------------------------------------------------------------------

    def break_pairing(self, pair: PairResult, reason: str) -> bool:
        """Record the user's break in the session and compare again with it."""
        return self._override("unpair", pair.native_seq, pair.oracle_seq, reason)

    def pair_records(self, native: UnalignedRecord, oracle: UnalignedRecord, reason: str) -> bool:
        """Record the user's pairing in the session and compare again with it."""
        return self._override("pair", native.seq, oracle.seq, reason)

    def undo_override(self, side: str, seq: int) -> bool:
        """Take back the user's manual pairings and breaks of this record, and compare again without them."""
        model, refs = self._model, self._session_refs()
        capture = model.native if side == "native" else model.oracle
        record = capture.record(seq) if capture is not None else None
        if side not in refs or record is None:
            return False
        mine = RecordRef(refs[side].id, RecordKey.of(record))
        undone = [o for o in self.session.overrides if mine in (o.left, o.right)]
        for override in undone:
            self.session.remove_override(override)
        if undone:
            self._recompare()
        return bool(undone)

    def _override(self, action: str, native_seq: int, oracle_seq: int, reason: str) -> bool:
        model, refs = self._model, self._session_refs()
        if len(refs) != 2 or model.native is None or model.oracle is None:
            self._banners.show_message("session", "warning", "The open captures are not recorded in the session yet; try again in a moment.")
            return False
        native, oracle = model.native.record(native_seq), model.oracle.record(oracle_seq)
        if native is None or oracle is None:
            self._banners.show_message("session", "warning", "The open captures no longer hold those records; open the pair again.")
            return False
        self.session.add_override(
            action, RecordRef(refs["native"].id, RecordKey.of(native)), RecordRef(refs["oracle"].id, RecordKey.of(oracle)), reason
        )
        self._recompare()
        return True

    # -- selection, view, reruns -------------------------------------------------------------

    def _select(self, op: OpKey, view: ViewState | None) -> bool:
        pair = cv.find_pair(self._model.comparison, op)
        if pair is None:
            self.say_missing(op)
            return False
        self._model.select(pair)
        spec = slice_spec_of(view, len(pair.metrics.shape)) if view is not None else None
        if spec is not None:
            self._view.load_slice(spec)
        return True

    def _selection_changed(self, pair: Any) -> None:
        if pair is None or self._restoring:
            return
        if pair.key != self.session.selected_op:
            self.session.select_op(pair.key)

    def current_view(self, with_layout: bool = False) -> ViewState:
        layout: dict[str, Any] = {"tab": self._view.panel()}
        if with_layout:
            layout["window_state"] = base64.b64encode(self._view.save_layout()).decode("ascii")
        elif "window_state" in self.session.view.layout:
            layout["window_state"] = self.session.view.layout["window_state"]
        return view_state_of(self._view.shown_slice(), self._model.scale, layout)

    def record_view(self, with_layout: bool = False) -> None:
        """Keep the view in the session; an empty window has none worth keeping (nor being asked about)."""
        if self._restoring or not self._model.has_pair:
            return
        view = self.current_view(with_layout)
        if view != self.session.view:
            self.session.set_view(view)

    def say_missing(self, op: OpKey) -> None:
        """A bookmark's or a saved selection's op is not in the comparison shown."""
        self._banners.show_message(MISSING_OP, "warning", f"{op.label()} is not in this comparison.")

    def forget_missing_ops(self) -> None:
        """Another comparison: an op missing from the last one may be in it."""
        self._banners.clear(MISSING_OP)

    def record_rerun(self, path: Path, identity: CaptureIdentity, key: str) -> None:
        op = OpKey.parse(key)
        self.session.add_rerun(path, identity, description=f"live rerun of {key} through MLX", op=op)

    # -- bookmarks ---------------------------------------------------------------------------

    def add_bookmark(self, note: str = "") -> Bookmark | None:
        pair = self._model.selected
        if pair is None:
            self._status("Select an op first, then bookmark it.", 5000)
            return None
        bookmark = self.session.add_bookmark(pair.key, note, self.current_view())
        self.bookmark_added.emit(bookmark)
        return bookmark

    def show_bookmark(self, bookmark: Bookmark) -> bool:
        view = bookmark.view
        if view is not None and view.colour_scale.mode in COLOUR_SCALES:
            self._model.set_scale(view.colour_scale.mode)
        self._view.show_panel(0)
        return self._select(bookmark.op, view)

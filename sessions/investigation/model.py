"""The saved investigation: what a user needs to stop, come back, and hand findings over.

Everything here points at data (capture paths plus the identity they had) and never
embeds it. Mutation goes through methods so every edit bumps `revision` and tells
subscribers what kind of thing changed: the autosaver writes the user's decisions at once and
the selection and view on a timer (`sessions.investigation.recovery.TIMED_KINDS`), and the
viewer knows what to redraw.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from sessions.capture.format import ROLES
from sessions.capture.identity import CaptureIdentity
from sessions.compare.align import AlignOverride, ManualBreak, ManualPair
from sessions.compare.align_modes import ALIGN_MODES, AUTO
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.tensor_diff import Tolerance

if TYPE_CHECKING:
    pass

OVERRIDE_ACTIONS = ("pair", "unpair")
"""`pair` forces two records together; `unpair` breaks a pairing the automatic alignment made."""


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RecordRef:
    capture_id: str
    key: RecordKey


@dataclass(frozen=True)
class AlignmentOverride:
    action: str
    left: RecordRef
    right: RecordRef
    reason: str
    created_utc: str = ""


@dataclass(frozen=True)
class SavedTolerance:
    """Thresholds that classify a difference's size; bits are always shown, so none hides a flip."""

    max_ulp: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    nmse: float = 1e-7
    """llama.cpp test-backend-ops' default NMSE threshold."""

    @property
    def bounds(self) -> Tolerance:
        """The comparison's tolerance of these thresholds (NMSE classifies, it bounds nothing)."""
        return Tolerance(self.atol, self.rtol, self.max_ulp)


@dataclass(frozen=True)
class ColourScale:
    mode: str = "symmetric"
    colormap: str = ""
    vmin: float | None = None
    vmax: float | None = None


INDEX_MAX = 2**63 - 1
"""The largest index a tensor axis takes (numpy's int64): a session's 10**30 was read, then failed where it was used."""
AxisSlice = Union[int, tuple[Union[int, None], Union[int, None], Union[int, None]]]
"""Per tensor axis: an index, or a (start, stop, step) range with None for an open end."""


def normal_slices(slices: Any) -> tuple[AxisSlice, ...]:
    """Slices as tuples (JSON brings lists); anything but an index or a 3-part range is refused."""
    out: list[AxisSlice] = []
    for axis, item in enumerate(slices):
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) <= INDEX_MAX:
            out.append(item)
            continue
        parts = tuple(item) if isinstance(item, (list, tuple)) else ()
        if len(parts) != 3 or not all(p is None or (isinstance(p, int) and not isinstance(p, bool) and abs(p) <= INDEX_MAX) for p in parts):
            raise ValueError(f"slice of axis {axis} must be an index or [start, stop, step] of indices (a part null = open), not {item!r}")
        if parts[2] == 0:
            raise ValueError(f"slice of axis {axis} has a step of 0, which no selection takes")
        out.append((parts[0], parts[1], parts[2]))
    return tuple(out)


@dataclass(frozen=True)
class ViewState:
    slices: tuple[AxisSlice, ...] = ()
    colour_scale: ColourScale = ColourScale()
    layout: Mapping[str, Any] = field(default_factory=dict)
    """Panel layout, owned by the viewer: any JSON-able dict (sizes, visible panels, tabs); the keys
    it reads back (row_axis, col_axis, tab, window_state) are checked when a session is read."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "slices", normal_slices(self.slices))

    def selection(self) -> tuple[int | slice, ...]:
        """The slices as a numpy selection, as `Capture.read_bits` takes it."""
        return tuple(s if isinstance(s, int) else slice(*s) for s in self.slices)

    def slice_text(self) -> str:
        """The slices as a user writes them, `[3, 0:16, :]`: reports printed Python's
        `[3, (0, 16, None), (None, None, None)]`."""

        def bound(value: int | None) -> str:
            return "" if value is None else str(value)

        def axis(item: AxisSlice) -> str:
            if isinstance(item, int):
                return str(item)
            start, stop, step = item
            return f"{bound(start)}:{bound(stop)}" + ("" if step is None else f":{step}")

        return "[" + ", ".join(axis(item) for item in self.slices) + "]"


@dataclass(frozen=True)
class Bookmark:
    id: str
    op: OpKey
    note: str
    created_utc: str = ""
    view: ViewState | None = None
    """The view when bookmarked, so the viewer (and the report) can show exactly what was marked."""


WHOLE_FILE = "/"
"""The capture location that is the whole HDF5 file: the only one this version opens."""


@dataclass(frozen=True)
class CaptureRef:
    id: str
    role: str
    path: Path
    """Absolute path of the capture file."""
    identity: CaptureIdentity
    location: str = WHOLE_FILE
    """Where in the file the capture lives (HDF5 path); the whole file is WHOLE_FILE."""
    profile: str = ""
    """The profile (name or file) mapping this engine's names to canonical ops; "" = detect."""
    relative_path: str | None = None
    """The path relative to the session file's folder when last saved, to find a moved folder."""

    @property
    def uri(self) -> str:
        return f"{self.path}::{self.location}"


@dataclass(frozen=True)
class RerunNote:
    capture: CaptureRef
    op: OpKey | None
    description: str
    """What was recomputed and how it differed from the run, e.g. "sdpa with head chunking off"."""
    created_utc: str = ""


class ChangeKind(str, Enum):
    CAPTURES = "captures"
    PROFILES = "profiles"
    TOLERANCES = "tolerances"
    ALIGNMENT = "alignment"
    SELECTION = "selection"
    VIEW = "view"
    BOOKMARK = "bookmark"
    NOTE = "note"
    RERUNS = "reruns"


Listener = Callable[[ChangeKind], None]


def check_json_able(value: Any, what: str) -> None:
    """Reject what the session file could not hold exactly (NaN, non-string keys, objects)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be plain JSON (finite numbers, string keys): {exc}") from None


def relative_path_from(path: Path, base_dir: Path) -> str | None:
    """`path` relative to `base_dir` in POSIX form (portable between machines); None across drives."""
    try:
        return Path(os.path.relpath(path, base_dir)).as_posix()
    except ValueError:
        return None


@dataclass
class Investigation:
    title: str = ""
    summary: str = ""
    """Free-text findings for the whole investigation."""
    created_utc: str = field(default_factory=utc_now)
    captures: tuple[CaptureRef, ...] = ()
    reruns: tuple[RerunNote, ...] = ()
    tolerance: SavedTolerance = SavedTolerance()
    op_tolerances: Mapping[str, SavedTolerance] = field(default_factory=dict)
    """Per canonical op, replacing `tolerance` for that op."""
    tolerance_policy: Path | None = None
    """A tolerance policy file (docs/tolerance-policy.md), by absolute path: read again at each
    comparison, as `report --tolerance-policy` reads it, never copied into the session."""
    overrides: tuple[AlignmentOverride, ...] = ()
    alignment_mode: str = AUTO
    """How records are paired (sessions.compare.align_modes), as `report --align`: the window's
    choice, and what `report --session` pairs by."""
    selected_op: OpKey | None = None
    view: ViewState = ViewState()
    bookmarks: tuple[Bookmark, ...] = ()
    revision: int = field(default=0, compare=False)
    _listeners: list[Listener] = field(default_factory=list, compare=False, repr=False)

    def snapshot(self) -> Investigation:
        """This session as it is now, for work on another thread: its fields are immutable, so
        a copy without the listeners (the window's panels) is enough."""
        return replace(self, _listeners=[])

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(kind)` after each edit; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self, kind: ChangeKind) -> None:
        self.revision += 1
        for listener in list(self._listeners):
            listener(kind)

    # captures ------------------------------------------------------------------------------

    def all_capture_refs(self) -> list[CaptureRef]:
        return [*self.captures, *(r.capture for r in self.reruns)]

    def capture(self, capture_id: str) -> CaptureRef:
        for ref in self.all_capture_refs():
            if ref.id == capture_id:
                return ref
        raise KeyError(f"no capture {capture_id!r} in this session")

    def captures_of(self, role: str) -> list[CaptureRef]:
        return [ref for ref in self.captures if ref.role == role]

    def _new_capture_id(self, role: str) -> str:
        taken = {ref.id for ref in self.all_capture_refs()}
        if role not in taken:
            return role
        n = 2
        while f"{role}-{n}" in taken:
            n += 1
        return f"{role}-{n}"

    def _make_ref(self, role: str, path: str | Path, identity: CaptureIdentity, location: str, profile: str) -> CaptureRef:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        return CaptureRef(self._new_capture_id(role), role, Path(path).absolute(), identity, location, profile)

    def add_capture(
        self, role: str, path: str | Path, identity: CaptureIdentity, *, location: str = WHOLE_FILE, profile: str = ""
    ) -> CaptureRef:
        """Add a capture with the identity it has now (see `capture_identity.identity_of_file`)."""
        ref = self._make_ref(role, path, identity, location, profile)
        self.captures = (*self.captures, ref)
        self._changed(ChangeKind.CAPTURES)
        return ref

    def remove_capture(self, capture_id: str) -> None:
        used = [o for o in self.overrides if capture_id in (o.left.capture_id, o.right.capture_id)]
        if used:
            raise ValueError(f"capture {capture_id!r} is named by {len(used)} alignment override(s); remove them first")
        self.capture(capture_id)
        self.captures = tuple(r for r in self.captures if r.id != capture_id)
        self.reruns = tuple(r for r in self.reruns if r.capture.id != capture_id)
        self._changed(ChangeKind.CAPTURES)

    def set_role(self, capture_id: str, role: str) -> None:
        """Give a capture another role (the user swapped native and oracle): its id stays, and so
        does every alignment override that names it."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        self._replace_ref(capture_id, role=role)
        self._changed(ChangeKind.CAPTURES)

    def _replace_ref(self, capture_id: str, **changes: Any) -> None:
        self.capture(capture_id)
        self.captures = tuple(replace(r, **changes) if r.id == capture_id else r for r in self.captures)
        self.reruns = tuple(
            replace(r, capture=replace(r.capture, **changes)) if r.capture.id == capture_id else r for r in self.reruns
        )

    def relink_capture(self, capture_id: str, path: str | Path, identity: CaptureIdentity) -> None:
        """Point a capture at a (moved or accepted) file; use `capture_identity.locate_capture`."""
        self._replace_ref(capture_id, path=Path(path).absolute(), identity=identity)
        self._changed(ChangeKind.CAPTURES)

    def set_profile(self, capture_id: str, profile: str) -> None:
        self._replace_ref(capture_id, profile=profile)
        self._changed(ChangeKind.PROFILES)

    def rebase(self, session_dir: Path) -> None:
        """Record each capture's path relative to the session folder (done by the store on save)."""
        base = Path(session_dir).absolute()
        self.captures = tuple(replace(r, relative_path=relative_path_from(r.path, base)) for r in self.captures)
        self.reruns = tuple(
            replace(r, capture=replace(r.capture, relative_path=relative_path_from(r.capture.path, base))) for r in self.reruns
        )

    def add_rerun(
        self,
        path: str | Path,
        identity: CaptureIdentity,
        *,
        description: str,
        op: OpKey | None = None,
        profile: str = "",
    ) -> RerunNote:
        result = RerunNote(self._make_ref("rerun", path, identity, "/", profile), op, description, utc_now())
        self.reruns = (*self.reruns, result)
        self._changed(ChangeKind.RERUNS)
        return result

    # profiles, tolerances, alignment -----------------------------------------------------

    def set_tolerance(self, tolerance: SavedTolerance, op: str | None = None) -> None:
        """Set the default tolerance, or (with `op`) the one for a canonical op."""
        if op is None:
            self.tolerance = tolerance
        else:
            self.op_tolerances = {**self.op_tolerances, op: tolerance}
        self._changed(ChangeKind.TOLERANCES)

    def set_alignment_mode(self, mode: str) -> None:
        if mode not in ALIGN_MODES:
            raise ValueError(f"alignment mode {mode!r} is not one of {', '.join(ALIGN_MODES)}")
        self.alignment_mode = mode
        self._changed(ChangeKind.ALIGNMENT)

    def set_tolerance_policy(self, path: str | Path | None) -> None:
        self.tolerance_policy = None if path is None else Path(path).absolute()
        self._changed(ChangeKind.TOLERANCES)

    def clear_op_tolerance(self, op: str) -> None:
        self.op_tolerances = {k: v for k, v in self.op_tolerances.items() if k != op}
        self._changed(ChangeKind.TOLERANCES)

    def tolerance_for(self, op: str) -> SavedTolerance:
        return self.op_tolerances.get(op, self.tolerance)

    def op_bounds(self) -> dict[str, Tolerance]:
        """Each per-op tolerance as the comparison's bounds (`tolerance_policy.with_op_rules`)."""
        return {op: saved.bounds for op, saved in self.op_tolerances.items()}

    def add_override(self, action: str, left: RecordRef, right: RecordRef, reason: str) -> AlignmentOverride:
        if action not in OVERRIDE_ACTIONS:
            raise ValueError(f"action must be one of {OVERRIDE_ACTIONS}, not {action!r}")
        if not reason.strip():
            raise ValueError("an alignment override needs a reason, so whoever reads the session knows why")
        for ref in (left, right):
            self.capture(ref.capture_id)
        override = AlignmentOverride(action, left, right, reason, utc_now())
        self.overrides = (*self.overrides, override)
        self._changed(ChangeKind.ALIGNMENT)
        return override

    def remove_override(self, override: AlignmentOverride) -> None:
        if override not in self.overrides:
            raise KeyError("that alignment override is not in this session")
        self.overrides = tuple(o for o in self.overrides if o != override)
        self._changed(ChangeKind.ALIGNMENT)

    # selection and view ------------------------------------------------------------------

    def select_op(self, op: OpKey | None) -> None:
        self.selected_op = op
        self._changed(ChangeKind.SELECTION)

    def set_view(self, view: ViewState) -> None:
        """Keep a copy of the view; the layout must be plain JSON so the file holds it exactly."""
        check_json_able(dict(view.layout), "the view layout")
        self.view = replace(view, layout=json.loads(json.dumps(dict(view.layout))))
        self._changed(ChangeKind.VIEW)

    # bookmarks and notes -----------------------------------------------------------------

    def bookmark(self, bookmark_id: str) -> Bookmark:
        for b in self.bookmarks:
            if b.id == bookmark_id:
                return b
        raise KeyError(f"no bookmark {bookmark_id!r} in this session")

    def add_bookmark(self, op: OpKey, note: str = "", view: ViewState | None = None) -> Bookmark:
        if view is not None:
            check_json_able(dict(view.layout), "the bookmarked view layout")
        bookmark = Bookmark(uuid.uuid4().hex, op, note, utc_now(), view)
        self.bookmarks = (*self.bookmarks, bookmark)
        self._changed(ChangeKind.BOOKMARK)
        return bookmark

    def set_note(self, bookmark_id: str, note: str) -> None:
        self.bookmark(bookmark_id)
        self.bookmarks = tuple(replace(b, note=note) if b.id == bookmark_id else b for b in self.bookmarks)
        self._changed(ChangeKind.NOTE)

    def remove_bookmark(self, bookmark_id: str) -> None:
        self.bookmark(bookmark_id)
        self.bookmarks = tuple(b for b in self.bookmarks if b.id != bookmark_id)
        self._changed(ChangeKind.BOOKMARK)

    def set_title(self, title: str) -> None:
        self.title = title
        self._changed(ChangeKind.NOTE)

    def set_summary(self, summary: str) -> None:
        self.summary = summary
        self._changed(ChangeKind.NOTE)


def overrides_for_pair(overrides: tuple[AlignmentOverride, ...], native_id: str, oracle_id: str) -> tuple[AlignOverride, ...]:
    """The session's overrides that concern this native/oracle pair of captures, as `align` takes
    them (either side may be `left`); overrides between other captures are not about this pair."""
    out: list[AlignOverride] = []
    for o in overrides:
        ends = {o.left.capture_id: o.left.key, o.right.capture_id: o.right.key}
        if set(ends) != {native_id, oracle_id}:
            continue
        native, oracle = ends[native_id], ends[oracle_id]
        out.append(ManualPair(native, oracle, o.reason) if o.action == "pair" else ManualBreak(native, o.reason))
    return tuple(out)

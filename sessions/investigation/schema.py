"""The session file format: JSON with an integer `schema_version` and a migration chain.

Old files are upgraded in memory one version at a time (`MIGRATIONS[v]` turns version v
into v + 1), so each migration is written once and every old version reaches the current
one through the same steps. A file from a newer Parity X-ray is read as far as this version
understands it (unknown keys ignored) and opened read-only: writing it back would drop what
the newer version stored. Everything else is read strictly, so damage is caught as damage.

Version history:
- 1: captures keyed by role (one per role) as "file.h5::/location" strings with flat
  identity fields; profiles keyed by role; op and record keys as "step/segment/layer/name/occ"
  strings; overrides between "native" and "oracle" only; bookmarks without a view.
- 2: captures are a list with ids (several per role, e.g. a CPU and a Metal oracle), path and
  in-file location apart, identity nested, profile and relative path per capture; structured
  op and record keys; overrides between any two captures; a bookmark keeps its view.
- 3: the tolerances name a tolerance policy file (`tolerances/policy`, a path or null).
- 4: the session says how records are paired (`alignment_mode`: "auto", "calls" or
  "positions", as `report --align`).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sessions.capture.format import ROLES
from sessions.capture.identity import CaptureIdentity
from sessions.compare.align_modes import ALIGN_MODES, AUTO
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.profiles import CANONICAL_OPS
from sessions.compare.tolerance_bounds import bound_problem, ulp_problem
from sessions.investigation.model import (
    OVERRIDE_ACTIONS,
    AlignmentOverride,
    Bookmark,
    CaptureRef,
    ColourScale,
    Investigation,
    RecordRef,
    RerunNote,
    SavedTolerance,
    ViewState,
    check_json_able,
    normal_slices,
    relative_path_from,
    utc_now,
)
from sessions.printable import printable
from sessions.side_file import load_json, parse_problem

FORMAT = "parity-xray-session"
SCHEMA_VERSION = 4
FILE_SUFFIX = ".xray"


class SessionFormatError(Exception):
    """A session document that cannot be read, with where and why (like `CaptureError`)."""

    def __init__(self, source: str, location: str, problem: str) -> None:
        self.source = source
        self.location = location
        self.problem = problem
        super().__init__(f"{source}: {location}: {problem}")


@dataclass
class DecodedSession:
    session: Investigation
    schema_version: int
    """The version the file was written in (before migration)."""
    unread: tuple[str, ...] = ()
    """Where a newer version's file holds keys this version does not know, and so did not read."""

    @property
    def newer(self) -> bool:
        return self.schema_version > SCHEMA_VERSION

    @property
    def read_only_reason(self) -> str | None:
        if self.newer_text is None:
            return None
        return f"{self.newer_text}; opened read-only so nothing it stored is lost. Use Save As to keep a copy."

    @property
    def newer_text(self) -> str | None:
        """That a newer version wrote the file, and where it stored what this version does not read; None for this version's or an older one's."""
        if not self.newer:
            return None
        text = f"written by a newer Parity X-ray (session schema {self.schema_version}; this version writes {SCHEMA_VERSION})"
        if not self.unread:
            return text
        shown = 4
        more = f" and {len(self.unread) - shown} more" if len(self.unread) > shown else ""
        return f"{text}; this version does not read what it stored at {', '.join(printable(p) for p in self.unread[:shown])}{more}"


# encoding ---------------------------------------------------------------------------------


def _op(op: OpKey | None) -> dict[str, Any] | None:
    """An op key as an object; `positions` only when the pair was aligned by position."""
    if op is None:
        return None
    fields = op._asdict()
    if not op.positions:
        del fields["positions"]
    else:
        fields["positions"] = list(op.positions)
    return fields


def _view(view: ViewState) -> dict[str, Any]:
    return {
        "slices": [s if isinstance(s, int) else list(s) for s in view.slices],
        "colour_scale": asdict(view.colour_scale),
        "layout": dict(view.layout),
    }


def _capture(ref: CaptureRef, base_dir: Path | None) -> dict[str, Any]:
    relative = ref.relative_path if base_dir is None else relative_path_from(ref.path, base_dir)
    return {
        "id": ref.id,
        "role": ref.role,
        "path": str(ref.path),
        "location": ref.location,
        "relative_path": relative,
        "profile": ref.profile,
        "identity": asdict(ref.identity),
    }


def _record(ref: RecordRef) -> dict[str, Any]:
    return {"capture_id": ref.capture_id, **asdict(ref.key)}


def encode_session(session: Investigation, base_dir: Path | None = None) -> dict[str, Any]:
    """The current-schema document; relative paths are computed against `base_dir` (the session file's folder)."""
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "saved_utc": utc_now(),
        "session": {
            "title": session.title,
            "summary": session.summary,
            "created_utc": session.created_utc,
            "captures": [_capture(r, base_dir) for r in session.captures],
            "reruns": [
                {
                    "capture": _capture(r.capture, base_dir),
                    "op": _op(r.op),
                    "description": r.description,
                    "created_utc": r.created_utc,
                }
                for r in session.reruns
            ],
            "tolerances": {
                "default": asdict(session.tolerance),
                "per_op": {op: asdict(t) for op, t in session.op_tolerances.items()},
                "policy": None if session.tolerance_policy is None else str(session.tolerance_policy),
            },
            "alignment_mode": session.alignment_mode,
            "alignment_overrides": [
                {
                    "action": o.action,
                    "left": _record(o.left),
                    "right": _record(o.right),
                    "reason": o.reason,
                    "created_utc": o.created_utc,
                }
                for o in session.overrides
            ],
            "selected_op": _op(session.selected_op),
            "view": _view(session.view),
            "bookmarks": [
                {
                    "id": b.id,
                    "op": _op(b.op),
                    "note": b.note,
                    "created_utc": b.created_utc,
                    "view": None if b.view is None else _view(b.view),
                }
                for b in session.bookmarks
            ],
        },
    }


def dumps(session: Investigation, base_dir: Path | None = None) -> bytes:
    document = encode_session(session, base_dir)
    check_json_able(document, "the session")
    return (json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


# decoding ---------------------------------------------------------------------------------

_MISSING = object()


class _Node:
    """A JSON object being read: typed getters that name the exact place of any problem."""

    def __init__(self, value: Any, where: str, source: str, unread: list[str] | None) -> None:
        """`unread`: None reads strictly (an unknown key is damage); a list (a newer version's
        file) collects the places of the keys this version does not know, shared by every node."""
        self.source = source
        self.where = where
        self.unread = unread
        if not isinstance(value, dict):
            raise self.fail(f"must be an object, not {type(value).__name__}")
        self.value = value
        self.used: set[str] = set()

    def fail(self, problem: str, key: str | None = None) -> SessionFormatError:
        # The top level is "/", not "" (it read "s.xray: : unknown key(s) extra").
        return SessionFormatError(self.source, (self.where + ("" if key is None else f"/{key}")) or "/", problem)

    def get(self, key: str, kinds: tuple[type, ...], default: Any = _MISSING) -> Any:
        self.used.add(key)
        if key not in self.value:
            if default is _MISSING:
                raise self.fail("is missing", key)
            return default
        value = self.value[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise self.fail(f"must be {names}, not {json.dumps(value)[:60]}", key)
        return value

    def text(self, key: str) -> str:
        return self.get(key, (str,))

    def integer(self, key: str) -> int:
        return self.get(key, (int,))

    def number(self, key: str) -> float:
        value = self.get(key, (int, float))
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise self.fail(f"is too large a number ({len(str(value))} digits)", key) from None

    def node(self, key: str) -> _Node:
        return _Node(self.get(key, (dict,)), f"{self.where}/{key}", self.source, self.unread)

    def nodes(self, key: str) -> list[_Node]:
        items = self.get(key, (list,))
        return [_Node(item, f"{self.where}/{key}/{i}", self.source, self.unread) for i, item in enumerate(items)]

    def optional_node(self, key: str) -> _Node | None:
        value = self.get(key, (dict, type(None)), None)
        return None if value is None else _Node(value, f"{self.where}/{key}", self.source, self.unread)

    def done(self) -> None:
        unknown = sorted(set(self.value) - self.used)
        if not unknown:
            return
        if self.unread is None:
            raise self.fail(f"unknown key(s) {', '.join(unknown)}")
        self.unread.extend(f"{self.where}/{key}" for key in unknown)


INT32_MAX = 2**31 - 1
"""A capture's steps, layers and occurrences are int32 (docs/capture-format.md)."""


def _read_op(n: _Node, canonical: bool = True) -> OpKey:
    """An op key; `canonical`: its op is one of CANONICAL_OPS (a rerun's may name a segment).
    A step past a capture's int32, or a bookmark on no canonical op, read as "not in this
    comparison" of every comparison."""
    positions = n.get("positions", (list,), [])
    if positions and (len(positions) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) for p in positions) or not 0 <= positions[0] < positions[1]):
        raise n.fail(f"must be [first, stop) token positions, not {json.dumps(positions)[:60]}", "positions")
    op = OpKey(n.integer("step"), n.text("segment"), n.integer("layer"), n.text("op"), n.integer("occurrence"), tuple(positions))
    for key, value, least in (("step", op.step, 0), ("layer", op.layer, -1), ("occurrence", op.occurrence, 0)):
        if not least <= value <= INT32_MAX:
            raise n.fail(f"is {value}; a capture's {key} is {least}..{INT32_MAX}", key)
    if canonical and op.op not in CANONICAL_OPS:
        raise n.fail(f"{op.op[:80]!r} is not a canonical op ({', '.join(sorted(CANONICAL_OPS))})", "op")
    n.done()
    return op


def _read_optional_op(n: _Node | None, canonical: bool = True) -> OpKey | None:
    return None if n is None else _read_op(n, canonical)


_NOT_JSON_NUMBER = "holds NaN or an infinity (1e999 reads as one), which a session never holds: it could not be saved again"


def _read_view(n: _Node) -> ViewState:
    scale = n.node("colour_scale")
    bounds = {key: scale.get(key, (int, float, type(None))) for key in ("vmin", "vmax")}
    for key, value in bounds.items():
        if value is not None and not math.isfinite(value):
            raise scale.fail(_NOT_JSON_NUMBER, key)
    colour = ColourScale(scale.text("mode"), scale.text("colormap"), bounds["vmin"], bounds["vmax"])
    scale.done()
    try:
        slices = normal_slices(n.get("slices", (list,)))
    except ValueError as exc:
        raise n.fail(str(exc), "slices") from None
    view = ViewState(slices, colour, _read_layout(n.node("layout")))
    n.done()
    return view


def _read_layout(n: _Node) -> dict[str, Any]:
    """The view's layout: free-form, but the keys the viewer reads back must hold what it reads
    there (a text axis raised in the window at int("x"); so did a state that is not base64)."""
    for key in ("row_axis", "col_axis", "tab"):
        value = n.get(key, (int, type(None)) if key == "row_axis" else (int,), None)
        if value is not None and value < 0:
            raise n.fail(f"must be at least 0, not {value}", key)
    try:
        check_json_able(n.value, "the layout")
    except ValueError:
        raise n.fail(_NOT_JSON_NUMBER) from None
    state = n.get("window_state", (str,), None)
    if state is not None:
        try:
            base64.b64decode(state, validate=True)
        except ValueError:  # binascii.Error is one
            raise n.fail("is not base64 text (a saved window layout)", "window_state") from None
    return dict(n.value)


def _beside(path: Path, source: str) -> Path:
    """A path a session names, relative ones taken from the session's folder (a hand-written file):
    the window read a relative policy from its working folder, `report --session` from the
    session's, and the two judged with different policies."""
    return path if path.is_absolute() else Path(source).absolute().parent / path


def _read_capture(n: _Node) -> CaptureRef:
    ident = n.node("identity")
    identity = CaptureIdentity(ident.integer("size"), ident.integer("mtime_ns"), ident.text("sha256"))
    # Values no file has: read, they made the capture "changed" and the window offered to accept it.
    if identity.size < 0:
        raise ident.fail(f"is {identity.size}; a file's size is at least 0", "size")
    if not re.fullmatch("[0-9a-f]{64}", identity.sha256):
        raise ident.fail(f"is {identity.sha256[:80]!r}; a SHA-256 is 64 lowercase hex digits", "sha256")
    ident.done()
    role = n.text("role")
    if role not in ROLES:
        raise n.fail(f"unknown role {role!r}", "role")
    ref = CaptureRef(
        n.text("id"),
        role,
        _beside(Path(n.text("path")), n.source),
        identity,
        n.text("location"),
        n.text("profile"),
        n.get("relative_path", (str, type(None))),
    )
    n.done()
    return ref


def _read_record(n: _Node) -> RecordRef:
    key = RecordKey(n.integer("step"), n.text("segment"), n.integer("layer"), n.text("name"), n.integer("occurrence"))
    ref = RecordRef(n.text("capture_id"), key)
    n.done()
    return ref


def _read_tolerance(n: _Node) -> SavedTolerance:
    """A saved tolerance, its bounds checked as the command line checks them: a session file from
    someone else must not make a failing pair pass (an rtol of -1 did) or crash a comparison."""
    max_ulp = n.integer("max_ulp")
    problem = ulp_problem(max_ulp)
    if problem is not None:
        raise n.fail(f"{problem}, not {max_ulp}", "max_ulp")
    bounds = {key: n.number(key) for key in ("atol", "rtol", "nmse")}
    for key, value in bounds.items():
        problem = bound_problem(value)
        if problem is not None:
            raise n.fail(f"{problem}, not {value}", key)
    tol = SavedTolerance(max_ulp, bounds["atol"], bounds["rtol"], bounds["nmse"])
    n.done()
    return tol


def _read_session(n: _Node) -> Investigation:
    captures = tuple(_read_capture(c) for c in n.nodes("captures"))
    reruns = []
    for r in n.nodes("reruns"):
        reruns.append(RerunNote(_read_capture(r.node("capture")), _read_optional_op(r.optional_node("op"), canonical=False), r.text("description"), r.text("created_utc")))
        r.done()
    tolerances = n.node("tolerances")
    default = _read_tolerance(tolerances.node("default"))
    per_op_node = tolerances.node("per_op")
    per_op = {op: _read_tolerance(per_op_node.node(op)) for op in list(per_op_node.value)}
    unknown = next((op for op in per_op if op not in CANONICAL_OPS), None)
    if unknown is not None:
        raise per_op_node.fail(f"is not a canonical op ({', '.join(sorted(CANONICAL_OPS))})", unknown)
    per_op_node.done()
    policy = tolerances.get("policy", (str, type(None)))
    if policy == "":
        raise tolerances.fail("is an empty path (null means no policy)", "policy")
    tolerances.done()
    ids = Counter([c.id for c in captures] + [r.capture.id for r in reruns])
    duplicates = sorted(i for i, count in ids.items() if count > 1)
    if duplicates:
        raise n.fail(f"capture id(s) {', '.join(duplicates)} used twice", "captures")
    mode = n.text("alignment_mode")
    if mode not in ALIGN_MODES:
        raise n.fail(f"must be one of {', '.join(ALIGN_MODES)}, not {mode!r}", "alignment_mode")
    overrides = []
    for o in n.nodes("alignment_overrides"):
        override = AlignmentOverride(o.text("action"), _read_record(o.node("left")), _read_record(o.node("right")), o.text("reason"), o.text("created_utc"))
        if override.action not in OVERRIDE_ACTIONS:
            raise o.fail(f"unknown action {override.action!r}", "action")
        for side in (override.left, override.right):
            if side.capture_id not in ids:
                raise o.fail(f"names capture {side.capture_id!r}, which this session does not have")
        o.done()
        overrides.append(override)
    bookmarks: list[Bookmark] = []
    for b in n.nodes("bookmarks"):
        op = _read_op(b.node("op"))
        view_node = b.optional_node("view")
        bookmark_id = b.text("id")
        if any(kept.id == bookmark_id for kept in bookmarks):  # editing one note edited both
            raise b.fail(f"bookmark id {bookmark_id!r} is used twice", "id")
        bookmarks.append(Bookmark(bookmark_id, op, b.text("note"), b.text("created_utc"), None if view_node is None else _read_view(view_node)))
        b.done()
    session = Investigation(
        title=n.text("title"),
        summary=n.text("summary"),
        created_utc=n.text("created_utc"),
        captures=captures,
        reruns=tuple(reruns),
        tolerance=default,
        op_tolerances=per_op,
        tolerance_policy=None if policy is None else _beside(Path(policy), n.source),
        overrides=tuple(overrides),
        alignment_mode=mode,
        selected_op=_read_optional_op(n.optional_node("selected_op")),
        view=_read_view(n.node("view")),
        bookmarks=tuple(bookmarks),
    )
    n.done()
    return session


# migrations -------------------------------------------------------------------------------


def _split_key(text: str, where: str, source: str) -> dict[str, Any]:
    """A v1 "step/segment/layer/name/occurrence" key; the name may itself contain slashes."""
    try:
        step, segment, layer, rest = text.split("/", 3)
        name, occurrence = rest.rsplit("/", 1)
        return {"step": int(step), "segment": segment, "layer": int(layer), "name": name, "occurrence": int(occurrence)}
    except ValueError:
        raise SessionFormatError(source, where, f"{text!r} is not a step/segment/layer/name/occurrence key") from None


def _v1_op(text: str | None, where: str, source: str) -> dict[str, Any] | None:
    if text is None:
        return None
    key = _split_key(text, where, source)
    key["op"] = key.pop("name")
    return key


def _v1_capture(capture_id: str, role: str, entry: dict[str, Any], profile: str) -> dict[str, Any]:
    path, sep, location = entry["path"].rpartition("::")
    if not sep:
        path, location = entry["path"], "/"
    return {
        "id": capture_id,
        "role": role,
        "path": path,
        "location": location,
        "relative_path": None,
        "profile": profile,
        "identity": {"size": entry["size"], "mtime_ns": entry["mtime_ns"], "sha256": entry["sha256"]},
    }


def upgrade_v1_to_v2(document: dict[str, Any], source: str) -> dict[str, Any]:
    where = "/session"
    try:
        old = document["session"]
        profiles = old.get("profiles", {})
        captures = [_v1_capture(role, role, entry, profiles.get(role, "")) for role, entry in old["captures"].items()]
        reruns = [
            {
                "capture": _v1_capture(f"rerun-{i}" if i > 1 else "rerun", "rerun", entry, ""),
                "op": _v1_op(entry.get("op"), f"{where}/reruns/{i - 1}/op", source),
                "description": entry["description"],
                "created_utc": entry["created_utc"],
            }
            for i, entry in enumerate(old["reruns"], start=1)
        ]
        overrides = [
            {
                "action": o["action"],
                "left": {"capture_id": "native", **_split_key(o["native"], f"{where}/alignment_overrides/{i}/native", source)},
                "right": {"capture_id": "oracle", **_split_key(o["oracle"], f"{where}/alignment_overrides/{i}/oracle", source)},
                "reason": o["reason"],
                "created_utc": "",
            }
            for i, o in enumerate(old["alignment_overrides"])
        ]
        bookmarks = [
            {**b, "op": _v1_op(b["op"], f"{where}/bookmarks/{i}/op", source), "view": None}
            for i, b in enumerate(old["bookmarks"])
        ]
        session = {
            **{k: v for k, v in old.items() if k != "profiles"},
            "captures": captures,
            "reruns": reruns,
            "alignment_overrides": overrides,
            "selected_op": _v1_op(old["selected_op"], f"{where}/selected_op", source),
            "bookmarks": bookmarks,
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise SessionFormatError(source, where, f"not a valid schema 1 session ({type(exc).__name__}: {exc})") from None
    return {**document, "schema_version": 2, "session": session}


def upgrade_v2_to_v3(document: dict[str, Any], source: str) -> dict[str, Any]:
    """A version-2 session compared without a policy file."""
    try:
        session = document["session"]
        tolerances = {**session["tolerances"], "policy": None}
    except (KeyError, TypeError) as exc:
        raise SessionFormatError(source, "/session/tolerances", f"not a valid schema 2 session ({type(exc).__name__}: {exc})") from None
    return {**document, "schema_version": 3, "session": {**session, "tolerances": tolerances}}


def upgrade_v3_to_v4(document: dict[str, Any], source: str) -> dict[str, Any]:
    """A version-3 session paired its records as `report` does by default."""
    session = document.get("session")
    if not isinstance(session, dict):
        raise SessionFormatError(source, "/session", "not a valid schema 3 session (no session object)")
    return {**document, "schema_version": 4, "session": {**session, "alignment_mode": AUTO}}


MIGRATIONS: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {1: upgrade_v1_to_v2, 2: upgrade_v2_to_v3, 3: upgrade_v3_to_v4}
"""MIGRATIONS[v] upgrades a version-v document to v + 1; every version below SCHEMA_VERSION has one."""


MAX_SCHEMA_VERSION = 1_000_000
"""A newer release's version is a few above this one's; anything past this is damage, not the future."""


def schema_version_of(document: Any, source: str) -> int:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise SessionFormatError(source, "/format", f"not a Parity X-ray session (format is {found!r})")
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SessionFormatError(source, "/schema_version", f"must be a positive integer, not {version!r}")
    if version > MAX_SCHEMA_VERSION:
        shown = str(version) if version < 10**20 else f"{str(version)[:12]}... ({len(str(version))} digits)"
        raise SessionFormatError(source, "/schema_version", f"{shown} is no version a Parity X-ray writes: the file is damaged")
    return version


def decode_document(document: Any, source: str) -> DecodedSession:
    """Migrate (if old) and read a parsed session document; raises `SessionFormatError`."""
    version = schema_version_of(document, source)
    current = document
    for v in range(version, SCHEMA_VERSION):
        current = MIGRATIONS[v](current, source)
    unread: list[str] | None = [] if version > SCHEMA_VERSION else None
    root = _Node(current, "", source, unread)
    root.text("format")
    root.integer("schema_version")
    root.text("saved_utc")
    session = _read_session(root.node("session"))
    root.done()
    return DecodedSession(session, version, tuple(unread or ()))


def loads(data: bytes, source: str) -> DecodedSession:
    try:
        document = load_json(data.decode("utf-8"))  # a key given twice is damage, not its last value (a hand edit)
    except UnicodeDecodeError as exc:
        raise SessionFormatError(source, "file", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise SessionFormatError(source, f"line {exc.lineno} column {exc.colno}", f"not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise SessionFormatError(source, "file", f"not valid JSON ({parse_problem(exc)})") from None
    return decode_document(document, source)

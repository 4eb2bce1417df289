"""What `parity-xray report --session FILE.xray` compares: the session's pair, profiles, tolerance, policy and manual pairings.

A headless report must not compare data the session was not saved with, so each capture's
identity is checked first (the same rule as the viewer's), and a moved or changed capture is
an unusable input with the reason, never a silent comparison of something else.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sessions.compare.align_modes import AUTO
from sessions.compare.profiles import ProfileError, resolve_profile
from sessions.compare.tolerance_policy import PolicyError, load_policy
from sessions.investigation.capture_gate import check_capture
from sessions.investigation.model import Investigation, overrides_for_pair
from sessions.investigation.store import SessionDocument, SessionOpenError


class SessionReportError(Exception):
    """The session cannot be reported on; the message names the file and the problem."""


def apply_session(args: argparse.Namespace) -> tuple[Investigation, str | None]:
    """Fill NATIVE, ORACLE, profiles, tolerances, the tolerance policy and the alignment mode from the session (command-line values win),
    and `overrides` with the session's manual pairings and breaks between the two captures, as the
    viewer applies them: a report on a session must say what its window says. Also returns a note
    for the user when a newer version wrote the file: what it stored there that this version does
    not read may be what makes that version judge the pair differently."""
    if args.native is not None or args.oracle is not None:
        raise SessionReportError("give either NATIVE ORACLE or --session FILE.xray, not both")
    try:
        document = SessionDocument.open(args.session, recover=False)
    except SessionOpenError as exc:
        raise SessionReportError(str(exc)) from None
    session, folder = document.session, Path(args.session).absolute().parent
    refs = {role: session.captures_of(role) for role in ("native", "oracle")}
    missing = [role for role, found in refs.items() if not found]
    if missing:
        raise SessionReportError(f"{args.session}: the session names no {' and no '.join(missing)} capture")
    for role, (ref, *_) in refs.items():
        status = check_capture(ref, folder)
        if not status.usable:
            raise SessionReportError(f"{args.session}: {role} capture {status.message}")
        setattr(args, role, str(ref.path))
        if getattr(args, f"{role}_profile") is None and ref.profile:
            try:
                resolve_profile(ref.profile)
            except ProfileError as exc:
                raise SessionReportError(f"{args.session}: /session/captures/{session.captures.index(ref)}/profile: {exc}") from None
            setattr(args, f"{role}_profile", ref.profile)
    tolerance = session.tolerance
    for name, value in (("atol", tolerance.atol), ("rtol", tolerance.rtol), ("max_ulp", tolerance.max_ulp)):
        if getattr(args, name) is None and value:
            setattr(args, name, value)
    if getattr(args, "tolerance_policy", None) is None and session.tolerance_policy is not None:
        policy = session.tolerance_policy  # read from the session's folder when relative, as the window reads it
        try:
            load_policy(policy)
        except PolicyError as exc:
            raise SessionReportError(f"{args.session}: /session/tolerances/policy: {exc}") from None
        args.tolerance_policy = str(policy)
    if getattr(args, "align", AUTO) == AUTO:  # `--align calls` or `positions` on the command line wins
        args.align = session.alignment_mode
    args.op_tolerances = session.op_bounds()
    args.overrides = overrides_for_pair(session.overrides, refs["native"][0].id, refs["oracle"][0].id)
    return session, None if document.newer is None else f"{args.session} was {document.newer}; this report follows what this version reads"

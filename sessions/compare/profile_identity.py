"""Which profile a comparison used, precisely enough to notice when it has changed.

A profile's name is not its identity: a user edits a TOML file and keeps its name, and two
files may share one. The content hash covers what decides a comparison -- the name, every
rule in file order and the validated contract routes, as parsed -- so comments and
formatting do not change it, and it is computed from the profile the comparison actually
ran with (re-reading the file later could see a newer edit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.compare.layout_transform import LayoutTransform
from sessions.compare.profiles import NameRule, Profile


@dataclass(frozen=True)
class ProfileIdentity:
    name: str
    path: str
    """The profile file, absolute (built-in profiles too); the source label when not a file."""
    sha256: str
    """Hex SHA-256 of the parsed content (see the module docstring)."""


def _rule_content(rule: NameRule) -> dict[str, Any]:
    content: dict[str, Any] = {}
    for f in dataclasses.fields(rule):
        value = getattr(rule, f.name)
        if isinstance(value, re.Pattern):
            continue
        content[f.name] = value.spec if isinstance(value, LayoutTransform) else value
    # An unset canonical occurrence hashes as the 0 it was stored as before a value given without
    # `occurrence` took effect: a profile whose meaning did not change keeps its identity, and one
    # whose meaning did (a value without `occurrence`) gets a new one.
    if rule.canonical_occurrence is None:
        content["canonical_occurrence"] = 0
    elif rule.occurrence is None:
        content["canonical_occurrence_without_occurrence"] = True
    return content


def profile_content_hash(profile: Profile) -> str:
    material = {
        "name": profile.name,
        "rules": [_rule_content(rule) for rule in profile.rules],
        "contracts": {k: list(v) for k, v in sorted(profile.contracts.items())},
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()


def identify(profile: Profile) -> ProfileIdentity:
    source = Path(profile.source)
    path = str(source.resolve()) if source.is_file() else profile.source
    return ProfileIdentity(profile.name, path, profile_content_hash(profile))

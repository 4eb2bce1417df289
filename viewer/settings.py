"""Persisted viewer state: window layout, recent files and theme, in QSettings.

The state is versioned so a later release can migrate an older file instead of
misreading it (as glue migrates its saved state). Recent files are paths, never data.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

ORGANISATION = "ParityXray"
APPLICATION = "parity-xray"
STATE_VERSION = 1
MAX_RECENT = 10
THEMES = ("dark", "light")


class ViewerSettings:
    """QSettings with typed accessors. A path gives a private INI file (tests, portable use)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        if path is None:
            self._qs = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANISATION, APPLICATION)
        else:
            self._qs = QSettings(str(path), QSettings.Format.IniFormat)
        self._migrate()

    def _migrate(self) -> None:
        """Version 0 (unversioned) stored recent files as one ';'-joined string."""
        version = int(self._qs.value("state_version", 0))
        if version == 0:
            legacy = self._qs.value("recent_files")
            if isinstance(legacy, str):
                self._qs.setValue("recent_files", [p for p in legacy.split(";") if p])
        if version < STATE_VERSION:
            self._qs.setValue("state_version", STATE_VERSION)

    def recent_files(self) -> list[str]:
        value = self._qs.value("recent_files", [])
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value or []]

    def add_recent(self, path: str | Path) -> list[str]:
        text = str(Path(path).resolve())
        recent = [text] + [p for p in self.recent_files() if p != text]
        self._qs.setValue("recent_files", recent[:MAX_RECENT])
        return self.recent_files()

    def recent_sessions(self) -> list[str]:
        value = self._qs.value("recent_sessions", [])
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value or []]

    def add_recent_session(self, path: str | Path) -> list[str]:
        text = str(Path(path).resolve())
        recent = [text] + [p for p in self.recent_sessions() if p != text]
        self._qs.setValue("recent_sessions", recent[:MAX_RECENT])
        return self.recent_sessions()

    def recovery_dir(self) -> Path | None:
        """Where autosaves go: beside a private INI file (tests, portable use), else the user data folder (None)."""
        return None if self.path is None else Path(self.path).parent / "recovery"

    def theme(self) -> str:
        value = str(self._qs.value("theme", "dark"))
        return value if value in THEMES else "dark"

    def set_theme(self, name: str) -> None:
        if name not in THEMES:
            raise ValueError(f"theme must be one of {THEMES}, not {name!r}")
        self._qs.setValue("theme", name)

    def window_geometry(self) -> QByteArray | None:
        value = self._qs.value("window/geometry")
        return value if isinstance(value, QByteArray) else None

    def window_state(self) -> QByteArray | None:
        value = self._qs.value("window/state")
        return value if isinstance(value, QByteArray) else None

    def save_window(self, geometry: QByteArray, state: QByteArray) -> None:
        self._qs.setValue("window/geometry", geometry)
        self._qs.setValue("window/state", state)

    def sync(self) -> None:
        self._qs.sync()

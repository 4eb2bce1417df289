"""Saved investigations: the document a user edits, its file format and migrations, autosave and crash recovery."""

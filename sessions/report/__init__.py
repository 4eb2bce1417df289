"""A comparison written out for people and programs: terminal text, the JSON document, the self-contained HTML page."""

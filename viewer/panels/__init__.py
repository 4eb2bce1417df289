"""The other panels: Overview, tokens, provenance, bookmarks, the dispatch timeline and rerun tabs."""

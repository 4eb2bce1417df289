"""The gate window: a gate's cases in a table, each opening its pair in a main window."""

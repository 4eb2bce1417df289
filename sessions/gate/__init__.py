"""Gates: many capture pairs judged like `report` on a Dask cluster, one summary, one exit code (docs/gate.md)."""

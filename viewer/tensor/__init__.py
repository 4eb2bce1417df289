"""The tensor diff panel: heatmaps, the element inspector, error plots, and their off-thread loading."""

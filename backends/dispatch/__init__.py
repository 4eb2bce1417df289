"""Attention dispatch timelines: every primitive call of both runs, slot-aligned and judged."""

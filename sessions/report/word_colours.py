"""The colour of each verdict word, on every surface that paints one (the window's strip, a
gate's window and its HTML page), so a word looks the same wherever it is read.

White text sits on each of them, so each is dark enough for a contrast of at least 4.5:1 (the
usual minimum for text): the earlier green and orange gave 3.5:1 and 3.0:1.
"""

from __future__ import annotations

from sessions.compare.verdict import (
    CONTRACT_MISMATCH,
    DISPATCH_ONLY,
    DIVERGENCE,
    PARITY,
    SIGNED_ZERO_ONLY,
    UNUSABLE,
)

WORD_COLOURS: dict[str, str] = {
    PARITY: "#268349",
    DIVERGENCE: "#cd423e",
    CONTRACT_MISMATCH: "#9757cb",
    SIGNED_ZERO_ONLY: "#ae5f2c",
    DISPATCH_ONLY: "#2a78b4",
    UNUSABLE: "#71757c",
}

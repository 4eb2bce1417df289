"""How the alignment tree writes the share of differing elements."""

from __future__ import annotations

import pytest

from viewer.comparison_view import share_text


@pytest.mark.parametrize(
    ("part", "whole", "text"),
    [
        (4608, 4608, "100%"),
        (4607, 4608, ">99%"),
        (27_961, 55_296, "51%"),
        (1_452, 15_360, "9.5%"),
        (3, 4608, "0.065%"),
        (1, 1_572_864, "<0.01%"),
    ],
)
def test_a_share_keeps_two_digits_and_never_rounds_to_all_or_none(part: int, whole: int, text: str) -> None:
    assert share_text(part, whole) == text

"""Non-overlapping windows over a raster: blocks for preparation, patches for validation.

Windows start every `size` pixels; the last row and column of windows are cut short at the raster's
edge, so together they cover every pixel exactly once whatever the raster's size.
"""

from __future__ import annotations

from typing import NamedTuple

# The prepared folder's manifest (datatools/landcover/prepare.py writes it, data.py reads it) and its version.
MANIFEST = "manifest.json"
FORMAT = 1


class Window(NamedTuple):
    row: int
    col: int
    height: int
    width: int


def windows(height: int, width: int, size: int) -> list[Window]:
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")
    return [
        Window(r, c, min(size, height - r), min(size, width - c))
        for r in range(0, height, size)
        for c in range(0, width, size)
    ]

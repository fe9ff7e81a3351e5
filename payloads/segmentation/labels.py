"""The payload's label convention and the Chesapeake Land Cover mapping.

Label rasters given to training hold 0 for "no data" and 1..C for the C land-cover classes. No-data pixels
are ignored by the loss and by every metric; the model predicts the C classes only (output channel k is
class k + 1).

Chesapeake Land Cover (LILA BC "Chesapeake Land Cover", its 1 m land-cover layer `lc`): 1 water, 2 tree
canopy / forest, 3 low vegetation / field, 4 barren land, 5 impervious (other), 6 impervious (road), 15 no
data. `--label-map chesapeake` maps 15 (and 0) to the
payload's no data and keeps 1-6: they are already the payload's classes.
"""

from __future__ import annotations

import numpy as np

NODATA = 0
IGNORE = -100  # torch's cross_entropy default ignore_index: targets of no-data pixels

CHESAPEAKE_CLASSES = (
    "water",
    "tree canopy / forest",
    "low vegetation / field",
    "barren land",
    "impervious (other)",
    "impervious (road)",
)
# raw value -> payload label; every raw value not listed is an error (named with its file)
CHESAPEAKE_MAP = {0: NODATA, 15: NODATA, **{v: v for v in range(1, 7)}}

LABEL_MAPS = {"identity": None, "chesapeake": CHESAPEAKE_MAP}


def apply_map(raw: np.ndarray, mapping: dict[int, int] | None, num_classes: int) -> tuple[np.ndarray, dict[int, int]]:
    """(labels as uint8, {raw value: pixel count} of values that are not a label): a raw value is bad when
    the map does not list it, or (identity) when it lies outside 0..num_classes."""
    values, counts = np.unique(raw, return_counts=True)
    if mapping is None:
        bad = {int(v): int(c) for v, c in zip(values, counts) if v < 0 or v > num_classes}
        return (raw.astype(np.uint8) if not bad else raw), bad
    bad = {int(v): int(c) for v, c in zip(values, counts) if int(v) not in mapping or mapping[int(v)] > num_classes}
    if bad:
        return raw, bad
    out = np.empty(raw.shape, dtype=np.uint8)
    for v in values:
        out[raw == v] = mapping[int(v)]
    return out, {}

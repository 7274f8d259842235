"""Which shapes are valid: count, enumerate, validate and sample them (no torch here).

- ``prism``: non-decreasing attention-head staircases (Prism Transformer).
- ``hourglass``: budget-matched grids over FFN stack depth K, L, d_model and d_h/d_model (Hourglass FFN).
- ``joint``: an hourglass shape with a Prism schedule on top.
"""

from search_spaces.base import SearchSpace
from search_spaces.factory import DEFAULT_BASELINE, SpaceOptions, build_space
from search_spaces.hourglass import GridPoint, HourglassSpace, Unmatched
from search_spaces.joint import JointSpace
from search_spaces.prism import PrismSpace

__all__ = [
    "DEFAULT_BASELINE",
    "GridPoint",
    "HourglassSpace",
    "JointSpace",
    "PrismSpace",
    "SearchSpace",
    "SpaceOptions",
    "Unmatched",
    "build_space",
]

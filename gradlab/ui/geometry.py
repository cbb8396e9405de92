"""The Geometry page's shared computation that its examples' record cards show too: removing an example.

One function for both pages: `ui.shared` keys a result by the function's file and name, so the same retraining
defined in each page's script was computed and stored twice.
"""

from __future__ import annotations

from gradlab import geometry
from gradlab.ui.cache import shared


@shared(label="Retraining without the example")
def removal(name, index):
    """`geometry.remove_example` of problem `name` without example `index`, shared by every session and both pages."""
    return geometry.remove_example(geometry.problem(name), index)

"""Several tables mixed by weight: :class:`Mixture` (``dataset.py``), its state
(``state.py``, no torch: audits read mixture states without it) and weights that change with
the draw or step (:class:`WeightSchedule`, ``weights.py``). ``Mixture`` loads on first use, so
importing this package for the state pulls in no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakeckpt_tables.lazy import lazy_names
from lakeckpt_tables.mixture.state import MIXTURE_FORMAT, is_mixture_state, merge_mixture_states
from lakeckpt_tables.mixture.weights import WeightSchedule
from lakeckpt_tables.plan.schedule import schedule

if TYPE_CHECKING:
    from lakeckpt_tables.mixture.dataset import SOURCE_KEY, Mixture

__all__ = ["MIXTURE_FORMAT", "SOURCE_KEY", "Mixture", "WeightSchedule", "is_mixture_state",
           "merge_mixture_states", "schedule"]

_HOMES = {"Mixture": "lakeckpt_tables.mixture.dataset",
          "SOURCE_KEY": "lakeckpt_tables.mixture.dataset"}

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)

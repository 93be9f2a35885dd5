"""Packing: tokenized documents into fixed-length sequences, in one place.

- ``stream.py``: the pure packer, (carry, rows) -> (sequences, carry, rows consumed)
  (NOTE [ packing ]);
- ``token_plan.py``: epochs planned in stream space, so ranks stay in lockstep by sequences
  (NOTE [ token plan ]);
- ``planner.py``: what a packing ``LakeDataset`` state means (:class:`TokenPlanner`) and the
  loop that reads a slice's packed batches (:func:`sequences`).

Names load lazily: the pure packer needs neither torch nor the reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakeckpt_tables.lazy import lazy_names

if TYPE_CHECKING:
    from lakeckpt_tables.reader.packing.planner import TokenPlanner, sequences
    from lakeckpt_tables.reader.packing.stream import (
        LAST_POLICIES,
        PackCarry,
        Packed,
        StreamWriter,
        check_packing,
        check_token_column,
        finish,
        pack,
        pack_array,
        warn_eos,
    )
    from lakeckpt_tables.reader.packing.token_plan import (
        StreamSizes,
        TokenPlan,
        packed_batches,
        stream_sizes,
    )

_STREAM = "lakeckpt_tables.reader.packing.stream"
_PLAN = "lakeckpt_tables.reader.packing.token_plan"
_HOMES = {
    **{n: _STREAM for n in ("LAST_POLICIES", "PackCarry", "Packed", "StreamWriter",
                            "check_packing", "check_token_column", "finish", "pack",
                            "pack_array", "warn_eos")},
    **{n: _PLAN for n in ("StreamSizes", "TokenPlan", "packed_batches", "stream_sizes")},
    "TokenPlanner": "lakeckpt_tables.reader.packing.planner",
    "sequences": "lakeckpt_tables.reader.packing.planner",
}
__all__ = [
    "LAST_POLICIES",
    "PackCarry",
    "Packed",
    "StreamSizes",
    "StreamWriter",
    "TokenPlan",
    "TokenPlanner",
    "check_packing",
    "check_token_column",
    "finish",
    "pack",
    "pack_array",
    "packed_batches",
    "sequences",
    "stream_sizes",
    "warn_eos",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)

"""The read plan: a pure function from (units, policy, segment, epoch) to every slice's rows.

No I/O, no clock, no global RNG, no torch. A *slice* is one (rank, DataLoader worker) pair,
numbered ``g = rank * workers + worker``; its reader state is one integer, the rows delivered.

NOTE [ pieces and layouts ]
An epoch's *base space* is the segment's units, permuted by a seed derived from
(seed, segment, epoch), laid end to end: rows ``[0, N)``. A *piece* is an ordered set of base
rows: a tuple of base-space spans, optionally permuted by a seed, of which the range
``[lo, hi)`` is taken. An epoch's *layout* is a tuple of pieces; by default the single piece
``[0, N)``. Slices get equal contiguous ranges of the layout, and a slice emits its range as
*windows*, which are pieces again: ``shuffle_window`` units at a time, rows permuted within
the window. Because a window is a piece, what a slice has not yet delivered (the rest of a
partially read window, then whole windows) is a list of pieces, and those lists, concatenated,
are the layout of an elastic re-plan for another world size. Any number of re-plans compose.

NOTE [ lockstep ]
With more than one rank every slice yields the same number of batches per epoch (one
collective per step). Batch ``j`` of a slice of ``s`` rows cut into ``n`` batches ends at
``min((j + 1) * batch_size, s - (n - 1 - j))``: full batches, except that a slice one row
short gives up one row in its last batch (or its last two). Sizes then differ by at most one
row across ranks, never in number. When that is impossible (batch size 1 with uneven slices,
or fewer rows than slices) the last ``rows mod slices`` rows of the layout form the epoch's
*tail*: reported by :meth:`EpochPlan.tail`, re-planned by an elastic resume, and in follow
mode carried into the next segment (NOTE [ segment tails are carried ] in
``lakeckpt_tables.reader.rounds``); an epoch's tail is not delivered.
"""

from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.layout_codec import decode_layout, encode_layout
from lakeckpt_tables.plan.order import BALANCE_CYCLE
from lakeckpt_tables.plan.pieces import Piece, cut_spans
from lakeckpt_tables.plan.policy import DEFAULT_SHUFFLE_WINDOW, PlanPolicy, derive_seed
from lakeckpt_tables.plan.replan import replan, replan_rounds
from lakeckpt_tables.plan.shuffle import BALANCED, FEISTEL, LEGACY, SHUFFLERS, permutation

__all__ = [
    "BALANCED",
    "BALANCE_CYCLE",
    "DEFAULT_SHUFFLE_WINDOW",
    "FEISTEL",
    "LEGACY",
    "SHUFFLERS",
    "EpochPlan",
    "Piece",
    "PlanPolicy",
    "cut_spans",
    "decode_layout",
    "derive_seed",
    "encode_layout",
    "permutation",
    "replan",
    "replan_rounds",
]

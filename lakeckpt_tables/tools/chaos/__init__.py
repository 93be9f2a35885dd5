"""``lakeckpt chaos``: :mod:`.campaign` attacks runs of :mod:`.job` and counts what breaks."""

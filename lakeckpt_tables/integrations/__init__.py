"""Trainers that keep their own checkpoints, each in a module of its own (imported only by
users who ask for it; the core never imports this package): their checkpoints committed to
the ledger through :class:`~lakeckpt_tables.checkpoint.RunLedger` (NOTE [ someone else's
checkpoint ]), their resume made a seek to the committed reader state.

- :mod:`lakeckpt_tables.integrations.lightning`: PyTorch Lightning 2.x (``LakeLedger``).
- :mod:`lakeckpt_tables.integrations.hf`: the Hugging Face Trainer (``LakeTrainer``,
  ``LakeTrainerCallback``).
- :mod:`lakeckpt_tables.integrations.ray_train`: Ray Train (``RayTrainLedger``).

torchrun's elastic agent needs no module: a restart takes the path of a relaunch.
"""

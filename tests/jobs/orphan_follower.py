"""A follower with DataLoader workers that waits for ever: the test SIGKILLs it."""

import sys

import torch  # noqa: F401  (import before deltalake, as a trainer would)
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset

dataset = LakeDataset(DeltaSource(sys.argv[1]), batch_size=4, follow=True, poll_interval=0.05,
                      min_segment_rows=2)
for _ in StatefulDataLoader(dataset, batch_size=None, num_workers=2):
    print("batch", flush=True)

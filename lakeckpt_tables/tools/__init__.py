"""The library's tools, apart from the library: nothing outside this package imports it.

- :mod:`.bench`: the figures of ``lakeckpt bench`` (throughput, resume, checkpoints, peers);
- :mod:`.chaos`: ``lakeckpt chaos``, a campaign of kills, bit flips and concurrent jobs;
- :mod:`.demo`: ``lakeckpt demo``, exactly-once resume across real SIGKILLs, proven twice;
- :mod:`.crash`: crash points, the SIGKILL that fills :mod:`lakeckpt_tables.hooks`;
- :mod:`.s3server`: a local S3 server (moto) that counts requests and injects faults;
- :mod:`.emulators`: local Azure Blob (Azurite) and GCS (fake-gcs-server) servers behind the
  same counting, faulty front.

The ``lakeckpt`` command imports the first three lazily, when their subcommand runs.
"""

"""The local S3 server (lakeckpt_tables/tools/s3server.py): ranged GETs served as a real store
serves them (NOTE [ ranged reads ]), and the request log the benches read."""

from __future__ import annotations

import time

import _s3server
import boto3
import pytest
from _s3server import S3Server

s3 = _s3server.s3  # the fixture of the module

BIG = 48 << 20


@pytest.fixture(scope="module")
def big_object(s3: S3Server) -> tuple[object, str, bytes]:
    client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=s3.key,
                          aws_secret_access_key=s3.secret, region_name="us-east-1")
    bucket = s3.bucket("ranges")
    body = bytes(range(256)) * (BIG // 256)
    client.put_object(Bucket=bucket, Key="dir/big.bin", Body=body)
    return client, bucket, body


def test_a_ranged_get_returns_exactly_its_bytes(big_object: tuple[object, str, bytes],
                                               s3: S3Server) -> None:
    client, bucket, body = big_object
    for spec, lo, hi in [("bytes=0-0", 0, 1), ("bytes=1000-2999", 1000, 3000),
                         (f"bytes={BIG - 10}-", BIG - 10, BIG),
                         (f"bytes={BIG - 10}-{BIG + 50}", BIG - 10, BIG)]:
        got = client.get_object(Bucket=bucket, Key="dir/big.bin", Range=spec)  # type: ignore[attr-defined]
        assert got["Body"].read() == body[lo:hi]
        assert got["ContentRange"] == f"bytes {lo}-{hi - 1}/{BIG}"
        assert got["ContentLength"] == hi - lo
    suffix = client.get_object(Bucket=bucket, Key="dir/big.bin", Range="bytes=-5")  # type: ignore[attr-defined]
    assert suffix["Body"].read() == body[-5:]  # moto's answer
    with pytest.raises(client.exceptions.NoSuchKey):  # type: ignore[attr-defined]
        client.get_object(Bucket=bucket, Key="dir/none.bin", Range="bytes=0-9")  # type: ignore[attr-defined]


def test_a_small_range_of_a_large_object_costs_its_length_not_the_objects(
        big_object: tuple[object, str, bytes], s3: S3Server) -> None:
    """moto alone copies the whole object for every ranged GET: 10 reads of 4 KB of a 48 MB
    object cost 4-5x one read of all of it (measured). A real store (and this server) serves
    them in about half of it: they must cost less than two."""
    client, bucket, _ = big_object

    def seconds(spec: str | None, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            extra = {"Range": spec} if spec else {}
            client.get_object(Bucket=bucket, Key="dir/big.bin", **extra)["Body"].read()  # type: ignore[attr-defined]
        return time.perf_counter() - started

    seconds("bytes=0-4095", 2)  # connections warm
    whole = min(seconds(None, 1) for _ in range(3))
    ranged = min(seconds("bytes=1000000-1004095", 10) for _ in range(3))
    assert ranged < 2 * whole


def test_the_request_log_gives_each_requests_span(big_object: tuple[object, str, bytes],
                                                  s3: S3Server) -> None:
    client, bucket, _ = big_object
    s3.reset()
    s3.faults(latency_ms=100)
    try:
        client.get_object(Bucket=bucket, Key="dir/big.bin", Range="bytes=0-9")  # type: ignore[attr-defined]
    finally:
        s3.faults()
    log = s3._control("requests")
    assert [r[:2] for r in log["requests"]] == [["GET", f"/{bucket}/dir/big.bin"]]
    (begin, end), = log["spans"]
    assert begin >= 0 and end - begin >= 0.1

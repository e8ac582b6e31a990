#!/usr/bin/env python3
"""Put and get throughput of an S3 endpoint with boto3, one request at a time.

    s3_bench.py --endpoint http://127.0.0.1:9000 --access-key AK --secret-key SK \
        [--sizes 1,64] [--seconds 20] [--label bulwark] [--encryption none|sse-c|sse-s3]
        [--checksum sdk|none|sha256]

For each size (MiB) it PUTs fresh keys for about --seconds (at least 3 objects), then GETs
them back the same way, and prints one line per size and operation: objects, MiB/s, and the
median latency. Bodies are random bytes generated before timing; GET bodies are read fully.
"""
import argparse
import os
import statistics
import time
import uuid

import boto3
from botocore.config import Config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--sizes", default="1,64", help="object sizes in MiB, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--encryption", default="none", choices=["none", "sse-c", "sse-s3"],
                    help="server-side encryption for every PUT and GET")
    ap.add_argument("--checksum", default="sdk", choices=["sdk", "none", "sha256"],
                    help="sdk: the SDK's default (CRC32); none: only when required; sha256")
    args = ap.parse_args()
    put_args, get_args = {}, {}
    if args.encryption == "sse-c":
        put_args = get_args = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": os.urandom(32)}
    elif args.encryption == "sse-s3":
        put_args = {"ServerSideEncryption": "AES256"}
    if args.checksum == "sha256":
        put_args = {**put_args, "ChecksumAlgorithm": "SHA256"}
    s3 = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        aws_access_key_id=args.access_key,
        aws_secret_access_key=args.secret_key,
        region_name=args.region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            request_checksum_calculation="when_required" if args.checksum == "none"
            else "when_supported",
        ),
    )
    bucket = "bench-" + uuid.uuid4().hex[:12]
    s3.create_bucket(Bucket=bucket)
    try:
        for mib in [int(x) for x in args.sizes.split(",") if x]:
            body = os.urandom(mib << 20)
            keys, put_lat = [], []
            start = time.monotonic()
            while len(keys) < 3 or time.monotonic() - start < args.seconds:
                key = f"o{len(keys)}"
                t = time.monotonic()
                s3.put_object(Bucket=bucket, Key=key, Body=body, **put_args)
                put_lat.append(time.monotonic() - t)
                keys.append(key)
            put_total = time.monotonic() - start
            get_lat = []
            start = time.monotonic()
            for key in keys:
                t = time.monotonic()
                got = s3.get_object(Bucket=bucket, Key=key, **get_args)["Body"].read()
                get_lat.append(time.monotonic() - t)
                assert len(got) == len(body), "short read"
            get_total = time.monotonic() - start
            for op, total, lat in (("put", put_total, put_lat), ("get", get_total, get_lat)):
                print(
                    f"{args.label}\t{mib} MiB\t{op}\t{len(keys)} objects\t"
                    f"{len(keys) * mib / total:.1f} MiB/s\tp50 {statistics.median(lat) * 1000:.0f} ms",
                    flush=True,
                )
            for key in keys:
                s3.delete_object(Bucket=bucket, Key=key)
    finally:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)


if __name__ == "__main__":
    main()

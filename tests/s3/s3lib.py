"""Helpers shared by the S3 compatibility suite (fixtures are in conftest.py).

The target comes from the environment that tests/s3/run.sh exports:
  S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION (default us-east-1),
  S3_TARGET=moto when the target is moto_server (self-validation of the suite),
  S3_MAX_OBJECT_BYTES when the gateway is configured with an object size limit.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import tempfile
import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import boto3
import botocore.auth
import botocore.awsrequest
import botocore.credentials
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

MiB = 1024 * 1024

# Hermetic clients: nothing from ~/.aws or AWS_* variables of the caller may change what the
# suite sends (a profile's endpoint, addressing style or checksum settings would).
for _name in list(os.environ):
    if _name.startswith("AWS_"):
        del os.environ[_name]
_EMPTY_AWS_DIR = tempfile.mkdtemp(prefix="bulwark-s3-aws-")
os.environ["AWS_CONFIG_FILE"] = os.path.join(_EMPTY_AWS_DIR, "config")
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(_EMPTY_AWS_DIR, "credentials")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@dataclass(frozen=True)
class Target:
    endpoint: str
    access_key: str
    secret_key: str
    region: str
    is_moto: bool
    max_object_bytes: int | None

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.endpoint).hostname

    @property
    def port(self) -> int:
        u = urllib.parse.urlsplit(self.endpoint)
        return u.port or (443 if u.scheme == "https" else 80)

    @property
    def netloc(self) -> str:
        return urllib.parse.urlsplit(self.endpoint).netloc


def _target_from_env() -> Target:
    endpoint = os.environ.get("S3_ENDPOINT")
    if not endpoint:
        raise pytest.UsageError("S3_ENDPOINT is not set: run the suite through tests/s3/run.sh")
    max_bytes = os.environ.get("S3_MAX_OBJECT_BYTES")
    return Target(
        endpoint=endpoint.rstrip("/"),
        access_key=os.environ["S3_ACCESS_KEY"],
        secret_key=os.environ["S3_SECRET_KEY"],
        region=os.environ.get("S3_REGION") or "us-east-1",
        is_moto=os.environ.get("S3_TARGET") == "moto",
        max_object_bytes=int(max_bytes) if max_bytes else None,
    )


TARGET = None


def target() -> Target:
    global TARGET
    if TARGET is None:
        TARGET = _target_from_env()
    return TARGET


def skip_on_moto(reason: str) -> None:
    """Skip a test whose real-S3 behaviour moto does not implement (the gateway must)."""
    if target().is_moto:
        pytest.skip(f"moto differs from S3 here: {reason}")


def make_client(access_key: str | None = None, secret_key: str | None = None, **config):
    t = target()
    cfg = Config(
        s3={"addressing_style": "path"},
        signature_version="s3v4",
        region_name=t.region,
        # One attempt: a retried 5xx or reset would hide exactly what the suite checks.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        **config,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=t.endpoint,
        aws_access_key_id=access_key if access_key is not None else t.access_key,
        aws_secret_access_key=secret_key if secret_key is not None else t.secret_key,
        region_name=t.region,
        config=cfg,
    )


# --------------------------------------------------------------------------- data helpers


def det_bytes(label: str, n: int) -> bytes:
    """n deterministic pseudo-random bytes named by label (same on every run and machine)."""
    return hashlib.shake_256(label.encode()).digest(n) if n else b""


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def quoted_md5(data: bytes) -> str:
    return f'"{md5_hex(data)}"'


def multipart_etag(parts: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(joined).hexdigest()}-{len(parts)}"'


def error_of(exc: ClientError) -> tuple[str, int]:
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]


def expect_error(fn, code, status: int, *args, **kwargs) -> ClientError:
    """Call fn and assert it fails with an S3 error code (str or set of accepted) and status."""
    with pytest.raises(ClientError) as info:
        fn(*args, **kwargs)
    got_code, got_status = error_of(info.value)
    codes = {code} if isinstance(code, str) else set(code)
    assert (got_code, got_status) in {(c, status) for c in codes}, (
        f"expected {sorted(codes)} / HTTP {status}, got {got_code} / HTTP {got_status}: "
        f"{info.value.response.get('Error')}"
    )
    return info.value


def parse_error_xml(body: bytes) -> dict:
    """Parse an S3 <Error> document; assert its shape; return its child elements as a dict."""
    assert body, "expected an S3 error XML body, got an empty body"
    root = ET.fromstring(body)
    tag = root.tag.split("}", 1)[-1]
    assert tag == "Error", f"root element is {root.tag!r}, not Error: {body[:300]!r}"
    fields = {child.tag.split("}", 1)[-1]: (child.text or "") for child in root}
    assert fields.get("Code"), f"no Code in error body: {body[:300]!r}"
    return fields


class _DeclaredPayloadAuth(botocore.auth.S3SigV4Auth):
    """SigV4 with x-amz-content-sha256 set to a declared value (a streaming mode) instead of the
    body's hash."""

    def __init__(self, credentials, service, region, declared: str):
        super().__init__(credentials, service, region)
        self._declared = declared

    def payload(self, request):
        return self._declared


def sign(method: str, path: str, *, query: str = "", body: bytes = b"",
         headers: dict | None = None, access_key=None, secret_key=None,
         payload: str | None = None) -> tuple[str, dict]:
    """SigV4-sign a request (header auth, signed payload); return its URL and all its headers.

    path is the already-encoded path ("/bucket/key"), query the already-encoded query string;
    payload, when given, is what x-amz-content-sha256 declares (STREAMING-UNSIGNED-PAYLOAD-TRAILER,
    say) instead of the body's hash.
    """
    t = target()
    url = t.endpoint + path + (("?" + query) if query else "")
    creds = botocore.credentials.Credentials(
        access_key if access_key is not None else t.access_key,
        secret_key if secret_key is not None else t.secret_key,
    )
    req = botocore.awsrequest.AWSRequest(method=method, url=url, data=body,
                                         headers=dict(headers or {}))
    if payload is None:
        botocore.auth.S3SigV4Auth(creds, "s3", t.region).add_auth(req)
    else:
        _DeclaredPayloadAuth(creds, "s3", t.region, payload).add_auth(req)
    prepared = req.prepare()
    out = dict(prepared.headers)
    out.setdefault("Host", t.netloc)
    out["Content-Length"] = str(len(body))
    return prepared.url, out


def signed_request(method: str, path: str, *, query: str = "", body: bytes = b"",
                   headers: dict | None = None, access_key=None, secret_key=None,
                   timeout: float = 60, payload: str | None = None) -> requests.Response:
    """Send a raw request signed with SigV4 (see sign())."""
    url, all_headers = sign(method, path, query=query, body=body, headers=headers,
                            access_key=access_key, secret_key=secret_key, payload=payload)
    return requests.request(method, url, headers=all_headers, data=body, timeout=timeout,
                            allow_redirects=False)


# --------------------------------------------------------------------------- buckets

_RUN_ID = time.strftime("%m%d%H%M%S", time.gmtime()) + secrets.token_hex(3)
_counter = itertools.count(1)
BUCKET_PREFIX = f"bwt-{_RUN_ID}-"


def unique_bucket_name(tag: str = "b") -> str:
    name = f"{BUCKET_PREFIX}{tag}-{next(_counter)}"
    assert len(name) <= 63, name
    return name


def empty_bucket(client, name: str) -> None:
    """Abort in-progress uploads and delete every object, version and delete marker of a
    bucket."""
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for up in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=name, Key=up["Key"],
                                              UploadId=up["UploadId"])
    except ClientError as e:
        # test_multipart.py asserts ListMultipartUploads itself; a target without it should
        # fail there, not in the clean-up of every test.
        if error_of(e)[0] != "NotImplemented":
            raise
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            resp = client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
            assert not resp.get("Errors"), resp.get("Errors")
    # A bucket whose versioning was set keeps versions and delete markers: each goes by its id.
    for _ in range(1000):
        page = client.list_object_versions(Bucket=name)
        doomed = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                  for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if not doomed:
            break
        resp = client.delete_objects(Bucket=name, Delete={"Objects": doomed, "Quiet": True})
        assert not resp.get("Errors"), resp.get("Errors")


def remove_bucket(client, name: str) -> None:
    try:
        empty_bucket(client, name)
        client.delete_bucket(Bucket=name)
    except ClientError as e:
        if error_of(e)[0] not in ("NoSuchBucket", "404"):
            raise

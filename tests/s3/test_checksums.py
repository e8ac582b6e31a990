"""x-amz-checksum-*: a checksum given in a header or in the body's trailer is checked before the
object or part is stored, and a mismatch stores nothing (BadDigest); the computed value comes
back in the response. The SDK's own default (a CRC32 trailer on every upload) must succeed.
"""

import base64
import hashlib
import zlib

import pytest
from botocore.exceptions import ClientError

from s3lib import error_of, expect_error, signed_request, skip_on_moto


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def _absent(s3, bucket, key):
    with pytest.raises(ClientError) as info:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_of(info.value)[1] == 404


def test_the_sdk_default_checksum_is_computed_and_returned(s3, bucket):
    body = b"checked on the way in" * 1000
    put = s3.put_object(Bucket=bucket, Key="default", Body=body, ChecksumAlgorithm="CRC32")
    assert put.get("ChecksumCRC32") == _crc32(body), put
    assert s3.get_object(Bucket=bucket, Key="default")["Body"].read() == body


def test_a_wrong_checksum_header_stores_nothing(s3, bucket):
    skip_on_moto("moto stores an object whatever checksum it is given")
    body = b"the real bytes"
    expect_error(s3.put_object, "BadDigest", 400, Bucket=bucket, Key="crc", Body=body,
                 ChecksumCRC32=_crc32(b"other bytes"))
    _absent(s3, bucket, "crc")
    expect_error(s3.put_object, "BadDigest", 400, Bucket=bucket, Key="sha", Body=body,
                 ChecksumSHA256=_sha256(b"other bytes"))
    _absent(s3, bucket, "sha")
    put = s3.put_object(Bucket=bucket, Key="sha", Body=body, ChecksumSHA256=_sha256(body))
    assert put.get("ChecksumSHA256") == _sha256(body), put


def test_a_malformed_checksum_is_refused(s3, bucket):
    skip_on_moto("moto stores an object whatever checksum it is given")
    expect_error(s3.put_object, "InvalidRequest", 400, Bucket=bucket, Key="bad", Body=b"x",
                 ChecksumCRC32="not-base64-of-four-bytes")
    _absent(s3, bucket, "bad")


def test_a_part_with_a_wrong_checksum_is_not_recorded(s3, bucket):
    skip_on_moto("moto records a part whatever checksum it is given")
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    try:
        part = b"p" * 1024
        expect_error(s3.upload_part, "BadDigest", 400, Bucket=bucket, Key="mp",
                     UploadId=upload, PartNumber=1, Body=part, ChecksumCRC32=_crc32(b"q"))
        parts = s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload).get("Parts", [])
        assert parts == [], parts
        done = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=part,
                              ChecksumCRC32=_crc32(part))
        assert done.get("ChecksumCRC32") == _crc32(part), done
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload)


def _trailer_put(bucket: str, key: str, body: bytes, checksum: str):
    """A PUT as SDKs send it over TLS: aws-chunked, unsigned payload, the CRC32 in the trailer."""
    chunked = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n"
               + f"x-amz-checksum-crc32:{checksum}\r\n\r\n".encode())
    return signed_request("PUT", f"/{bucket}/{key}", body=chunked,
                          payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER", headers={
        "Content-Encoding": "aws-chunked",
        "X-Amz-Decoded-Content-Length": str(len(body)),
        "X-Amz-Trailer": "x-amz-checksum-crc32",
    })


def test_a_checksum_in_the_trailer_is_checked(s3, bucket):
    skip_on_moto("moto does not check trailing checksums")
    body = b"sent in chunks" * 100
    wrong = _trailer_put(bucket, "trailer-wrong", body, _crc32(b"other"))
    assert wrong.status_code == 400 and b"BadDigest" in wrong.content, wrong.content
    _absent(s3, bucket, "trailer-wrong")
    right = _trailer_put(bucket, "trailer", body, _crc32(body))
    assert right.status_code == 200, right.content
    assert right.headers.get("x-amz-checksum-crc32") == _crc32(body), right.headers
    assert s3.get_object(Bucket=bucket, Key="trailer")["Body"].read() == body


def test_an_announced_trailer_that_never_comes_stores_nothing(s3, bucket):
    skip_on_moto("moto does not check trailing checksums")
    body = b"no trailer follows"
    resp = signed_request("PUT", f"/{bucket}/untrailed", body=body,
                          headers={"X-Amz-Trailer": "x-amz-checksum-crc32"})
    assert resp.status_code == 400, (resp.status_code, resp.content)
    _absent(s3, bucket, "untrailed")


def test_two_checksums_for_one_body_are_refused(s3, bucket):
    skip_on_moto("moto stores an object whatever checksum it is given")
    body = b"one body, one checksum"
    expect_error(s3.put_object, "InvalidRequest", 400, Bucket=bucket, Key="two", Body=body,
                 ChecksumCRC32=_crc32(body), ChecksumSHA256=_sha256(body))
    _absent(s3, bucket, "two")
    # The same checksum in a header and in the trailer: a wrong trailer must not hide behind a
    # right header.
    chunked = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n"
               + f"x-amz-checksum-crc32:{_crc32(b'other')}\r\n\r\n".encode())
    resp = signed_request("PUT", f"/{bucket}/both", body=chunked,
                          payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER", headers={
                              "Content-Encoding": "aws-chunked",
                              "X-Amz-Decoded-Content-Length": str(len(body)),
                              "X-Amz-Trailer": "x-amz-checksum-crc32",
                              "X-Amz-Checksum-Crc32": _crc32(body),
                          })
    assert resp.status_code == 400, (resp.status_code, resp.content)
    _absent(s3, bucket, "both")


def test_checksum_mode_returns_the_checksum_the_object_was_stored_with(s3, bucket):
    body = b"kept with the object" * 500
    s3.put_object(Bucket=bucket, Key="kept", Body=body, ChecksumAlgorithm="SHA256")
    got = s3.get_object(Bucket=bucket, Key="kept", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got.get("ChecksumSHA256") == _sha256(body), got
    head = s3.head_object(Bucket=bucket, Key="kept", ChecksumMode="ENABLED")
    assert head.get("ChecksumSHA256") == _sha256(body), head
    # Not asked for, or for part of the object: none.
    assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="kept")
    ranged = s3.get_object(Bucket=bucket, Key="kept", Range="bytes=0-9", ChecksumMode="ENABLED")
    assert ranged["Body"].read() == body[:10]
    assert "ChecksumSHA256" not in ranged


def test_a_multipart_upload_gets_the_composite_checksum_of_its_parts(s3, tgt, bucket):
    parts = [bytes([i]) * (5 * 1024 * 1024) for i in (1, 2)] + [b"tail"]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm="CRC32")["UploadId"]
    listed = []
    for n, data in enumerate(parts, start=1):
        resp = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=n, Body=data,
                              ChecksumAlgorithm="CRC32")
        assert resp["ChecksumCRC32"] == _crc32(data)
        listed.append({"PartNumber": n, "ETag": resp["ETag"], "ChecksumCRC32": _crc32(data)})
    got = s3.list_parts(Bucket=bucket, Key="mp", UploadId=uid)["Parts"]
    if not tgt.is_moto:  # moto lists parts without their checksums
        assert [p["ChecksumCRC32"] for p in got] == [_crc32(d) for d in parts]
    # A part checksum that is not the part's is refused, and the upload stays.
    wrong = [dict(listed[0], ChecksumCRC32=_crc32(b"other"))] + listed[1:]
    if not tgt.is_moto:  # moto does not compare them
            expect_error(s3.complete_multipart_upload, {"InvalidPart", "BadDigest"}, 400,
                     Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={"Parts": wrong})
    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid,
                                        MultipartUpload={"Parts": listed})
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"".join(parts)
    if tgt.is_moto:  # moto keeps no composite checksum
        return
    crcs = b"".join(zlib.crc32(d).to_bytes(4, "big") for d in parts)
    composite = f"{_crc32(crcs)}-{len(parts)}"
    assert done["ChecksumCRC32"] == composite, done
    head = s3.head_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == composite


def test_full_object_multipart_checksums_are_refused_or_kept(s3, bucket):
    skip_on_moto("moto takes a full-object checksum type without computing it")
    expect_error(s3.create_multipart_upload, "NotImplemented", 501, Bucket=bucket, Key="f",
                 ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
    expect_error(s3.create_multipart_upload, "NotImplemented", 501, Bucket=bucket, Key="f",
                 ChecksumAlgorithm="CRC64NVME")

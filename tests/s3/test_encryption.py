"""Server-side encryption: SSE-C (the customer's key on every request) and SSE-S3 (the gateway's
key). Objects round-trip with their key, are refused without it or with another, and the
storage nodes hold only ciphertext (checked on their files when the suite knows where they are).
"""

import base64
import hashlib
import os
import pathlib

import pytest
from botocore.exceptions import ClientError

from s3lib import MiB, error_of, expect_error, skip_on_moto


def _customer(key: bytes) -> dict:
    """boto3's SSE-C arguments for `key` (it adds the key's MD5 itself)."""
    return {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}


def _copy_source_customer(key: bytes) -> dict:
    return {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": key}


def _md5_b64(key: bytes) -> str:
    return base64.b64encode(hashlib.md5(key).digest()).decode()


MOTO_SSE_C = "moto does not implement SSE-C: it serves the object without its key"


def test_sse_c_objects_round_trip_only_with_their_key(s3, bucket):
    skip_on_moto(MOTO_SSE_C)
    key = os.urandom(32)
    small = os.urandom(3000)
    big = os.urandom(9 * MiB + 17)
    for name, body in [("small", small), ("big", big)]:
        put = s3.put_object(Bucket=bucket, Key=name, Body=body, **_customer(key))
        assert put["SSECustomerAlgorithm"] == "AES256", put
        assert put["SSECustomerKeyMD5"] == _md5_b64(key), put
        assert put["ETag"].strip('"') != hashlib.md5(body).hexdigest()
        got = s3.get_object(Bucket=bucket, Key=name, **_customer(key))
        assert got["SSECustomerKeyMD5"] == _md5_b64(key)
        assert got["Body"].read() == body
        head = s3.head_object(Bucket=bucket, Key=name, **_customer(key))
        assert head["ContentLength"] == len(body)
        assert head["SSECustomerAlgorithm"] == "AES256"
    # A range across the first chunk boundary (4 MiB).
    ranged = s3.get_object(Bucket=bucket, Key="big", Range=f"bytes={4 * MiB - 5}-{4 * MiB + 4}",
                           **_customer(key))
    assert ranged["Body"].read() == big[4 * MiB - 5:4 * MiB + 5]
    # Without the key, with another key, or with a key for an object that has none.
    expect_error(s3.get_object, "InvalidRequest", 400, Bucket=bucket, Key="small")
    expect_error(s3.head_object, {"InvalidRequest", "400", "Bad Request"}, 400, Bucket=bucket, Key="small")
    expect_error(s3.get_object, "AccessDenied", 403, Bucket=bucket, Key="small",
                 **_customer(os.urandom(32)))
    s3.put_object(Bucket=bucket, Key="plain", Body=b"v")
    expect_error(s3.get_object, "InvalidRequest", 400, Bucket=bucket, Key="plain",
                 **_customer(key))


def test_sse_c_headers_are_checked(s3, bucket):
    skip_on_moto("moto does not check the customer key's MD5")
    from s3lib import signed_request

    key = os.urandom(32)
    headers = {
        "x-amz-server-side-encryption-customer-algorithm": "AES256",
        "x-amz-server-side-encryption-customer-key": base64.b64encode(key).decode(),
        "x-amz-server-side-encryption-customer-key-MD5": _md5_b64(b"another key"),
    }
    resp = signed_request("PUT", f"/{bucket}/k", body=b"v", headers=headers)
    assert resp.status_code == 400 and "InvalidArgument" in resp.text, resp.text
    headers["x-amz-server-side-encryption-customer-key-MD5"] = _md5_b64(key)
    headers["x-amz-server-side-encryption-customer-algorithm"] = "AES128"
    resp = signed_request("PUT", f"/{bucket}/k", body=b"v", headers=headers)
    assert resp.status_code == 400, resp.text
    headers["x-amz-server-side-encryption-customer-algorithm"] = "AES256"
    headers["x-amz-server-side-encryption"] = "AES256"
    resp = signed_request("PUT", f"/{bucket}/k", body=b"v", headers=headers)
    assert resp.status_code == 400, resp.text
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="k")


def test_sse_c_multipart_uploads_need_the_key_on_every_part(s3, bucket):
    skip_on_moto(MOTO_SSE_C)
    key = os.urandom(32)
    part1 = os.urandom(5 * MiB)
    part2 = os.urandom(1000)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp", **_customer(key))
    assert upload["SSECustomerAlgorithm"] == "AES256", upload
    uid = upload["UploadId"]
    expect_error(s3.upload_part, "InvalidRequest", 400, Bucket=bucket, Key="mp", UploadId=uid,
                 PartNumber=1, Body=part1)
    expect_error(s3.upload_part, "AccessDenied", 403, Bucket=bucket, Key="mp", UploadId=uid,
                 PartNumber=1, Body=part1, **_customer(os.urandom(32)))
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=part1,
                        **_customer(key))["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=2, Body=part2,
                        **_customer(key))["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    got = s3.get_object(Bucket=bucket, Key="mp", **_customer(key))
    assert got["Body"].read() == part1 + part2
    part = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2, **_customer(key))
    assert part["Body"].read() == part2
    # The SDK's transfer manager: a CRC32 upload whose completion gives the key.
    import io

    from boto3.s3.transfer import TransferConfig
    body = os.urandom(11 * MiB)
    s3.upload_fileobj(io.BytesIO(body), bucket, "managed", ExtraArgs=_customer(key),
                      Config=TransferConfig(multipart_threshold=5 * MiB,
                                            multipart_chunksize=5 * MiB))
    got = s3.get_object(Bucket=bucket, Key="managed", ChecksumMode="ENABLED", **_customer(key))
    assert got["Body"].read() == body
    assert got.get("ChecksumCRC32", "").endswith("-3"), got


def test_sse_s3_objects_say_so_and_read_without_a_key(s3, tgt, bucket):
    body = os.urandom(2 * MiB + 3)
    put = s3.put_object(Bucket=bucket, Key="g", Body=body, ServerSideEncryption="AES256")
    assert put["ServerSideEncryption"] == "AES256", put
    got = s3.get_object(Bucket=bucket, Key="g")
    assert got["ServerSideEncryption"] == "AES256"
    assert got["Body"].read() == body
    assert s3.head_object(Bucket=bucket, Key="g")["ServerSideEncryption"] == "AES256"
    if tgt.is_moto:
        return  # moto ignores customer keys (see MOTO_SSE_C)
    expect_error(s3.get_object, "InvalidRequest", 400, Bucket=bucket, Key="g",
                 **_customer(os.urandom(32)))
    # A customer key and SSE-S3 together.
    expect_error(s3.put_object, {"InvalidArgument", "InvalidRequest"}, 400, Bucket=bucket,
                 Key="both", Body=b"v", ServerSideEncryption="AES256", **_customer(os.urandom(32)))


def test_copies_move_between_keys(s3, bucket):
    skip_on_moto(MOTO_SSE_C)
    alice, bob = os.urandom(32), os.urandom(32)
    body = os.urandom(5 * MiB + 1)
    s3.put_object(Bucket=bucket, Key="a", Body=body, **_customer(alice))
    # The source's key is needed to copy it.
    expect_error(s3.copy_object, "InvalidRequest", 400, Bucket=bucket, Key="b",
                 CopySource={"Bucket": bucket, "Key": "a"})
    s3.copy_object(Bucket=bucket, Key="b", CopySource={"Bucket": bucket, "Key": "a"},
                   **_copy_source_customer(alice), **_customer(bob))
    assert s3.get_object(Bucket=bucket, Key="b", **_customer(bob))["Body"].read() == body
    expect_error(s3.get_object, "AccessDenied", 403, Bucket=bucket, Key="b", **_customer(alice))
    s3.copy_object(Bucket=bucket, Key="g", CopySource={"Bucket": bucket, "Key": "b"},
                   ServerSideEncryption="AES256", **_copy_source_customer(bob))
    assert s3.get_object(Bucket=bucket, Key="g")["Body"].read() == body
    # A copy that names no encryption is not stored in the clear: SSE-S3, as S3's default
    # bucket encryption gives it.
    copied = s3.copy_object(Bucket=bucket, Key="inherited", CopySource={"Bucket": bucket, "Key": "a"},
                            **_copy_source_customer(alice))
    assert copied["ServerSideEncryption"] == "AES256", copied
    inherited = s3.get_object(Bucket=bucket, Key="inherited")
    assert inherited["ServerSideEncryption"] == "AES256"
    assert inherited["Body"].read() == body
    # An SSE-S3 object's ETag is its MD5, as in S3.
    assert inherited["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    # UploadPartCopy from an SSE-C source into an SSE-S3 upload.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp",
                                     ServerSideEncryption="AES256")["UploadId"]
    etag = s3.upload_part_copy(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1,
                               CopySource={"Bucket": bucket, "Key": "a"},
                               CopySourceRange="bytes=10-99",
                               **_copy_source_customer(alice))["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == body[10:100]


def test_sse_kms_is_refused(s3, bucket):
    skip_on_moto("moto accepts any KMS key id")
    expect_error(s3.put_object, "NotImplemented", 501, Bucket=bucket, Key="kms", Body=b"v",
                 ServerSideEncryption="aws:kms", SSEKMSKeyId="k")
    expect_error(s3.head_object, {"NoSuchKey", "404", "Not Found"}, 404, Bucket=bucket, Key="kms")


def _files_holding(root: pathlib.Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.stat().st_size > 4 << 30:
            continue
        data = path.read_bytes()
        if any(data.find(needle) >= 0 for needle in needles):
            found.append(str(path.relative_to(root)))
    return found


def test_storage_nodes_hold_no_plaintext_of_encrypted_objects(s3, bucket):
    stores = os.environ.get("S3_NODE_STORES")
    if not stores:
        skip_on_moto("moto's storage is not Bulwark nodes")
        pytest.skip("S3_NODE_STORES is not set: the nodes' files are not reachable from here")
    root = pathlib.Path(stores)
    payloads = {"sse-c": os.urandom(2 * MiB), "sse-s3": os.urandom(2 * MiB),
                "clear": os.urandom(2 * MiB), "small-sse-c": os.urandom(200_000)}
    key = os.urandom(32)
    s3.put_object(Bucket=bucket, Key="sse-c", Body=payloads["sse-c"], **_customer(key))
    s3.put_object(Bucket=bucket, Key="small-sse-c", Body=payloads["small-sse-c"],
                  **_customer(key))
    s3.put_object(Bucket=bucket, Key="sse-s3", Body=payloads["sse-s3"],
                  ServerSideEncryption="AES256")
    s3.put_object(Bucket=bucket, Key="clear", Body=payloads["clear"])

    def needles(data: bytes) -> list[bytes]:
        return [data[i:i + 48] for i in range(0, len(data) - 48, len(data) // 64)]

    # The control: an object stored in the clear is found on the nodes, so the search works.
    assert _files_holding(root, needles(payloads["clear"])), "the clear object was not found"
    for name in ("sse-c", "small-sse-c", "sse-s3"):
        assert not _files_holding(root, needles(payloads[name])), f"plaintext of {name} on a node"

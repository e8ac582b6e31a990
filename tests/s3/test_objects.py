"""Objects: put, get (ranges), head, delete, delete-multiple, copy, metadata, content type, ETag."""

import datetime

import pytest

from s3lib import MiB, det_bytes, expect_error, md5_hex, quoted_md5, signed_request, target


@pytest.mark.parametrize("size", [0, 1, 1000, MiB + 7, 6 * MiB + 3])
def test_put_get_head_roundtrip(s3, bucket, size):
    data = det_bytes(f"roundtrip-{size}", size)
    key = f"obj-{size}"
    put = s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert put["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert put["ETag"] == quoted_md5(data)

    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert got["Body"].read() == data
    assert got["ContentLength"] == size
    assert got["ETag"] == quoted_md5(data)

    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert head["ContentLength"] == size
    assert head["ETag"] == quoted_md5(data)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((now - head["LastModified"]).total_seconds()) < 300, head["LastModified"]


def test_etag_is_quoted_hex_md5_everywhere(s3, bucket):
    data = b"The quick brown fox jumps over the lazy dog"
    assert md5_hex(data) == "9e107d9d372bb6826bd81d3542a419d6"
    put = s3.put_object(Bucket=bucket, Key="fox", Body=data)
    expected = '"9e107d9d372bb6826bd81d3542a419d6"'
    assert put["ETag"] == expected
    assert s3.head_object(Bucket=bucket, Key="fox")["ETag"] == expected
    assert s3.get_object(Bucket=bucket, Key="fox")["ETag"] == expected
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["ETag"], o["Size"]) for o in listed] == [("fox", expected, len(data))]
    listed = s3.list_objects(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["ETag"], o["Size"]) for o in listed] == [("fox", expected, len(data))]


def test_overwrite_replaces_content_and_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"first version", Metadata={"v": "1"},
                  ContentType="text/plain")
    s3.put_object(Bucket=bucket, Key="k", Body=b"second", Metadata={"w": "2"},
                  ContentType="application/json")
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"second"
    assert got["Metadata"] == {"w": "2"}
    assert got["ContentType"] == "application/json"
    assert got["ETag"] == quoted_md5(b"second")


def test_user_metadata_and_content_type_roundtrip(s3, bucket):
    meta = {"color": "blue", "owner": "bulwark test", "empty-ish": "-", "mixed-case": "Value"}
    s3.put_object(Bucket=bucket, Key="m", Body=b"payload", ContentType="text/x-bulwark; charset=utf-8",
                  Metadata={"color": "blue", "owner": "bulwark test", "empty-ish": "-",
                            "Mixed-Case": "Value"})
    head = s3.head_object(Bucket=bucket, Key="m")
    # S3 stores user metadata names in lower case; values are kept as sent.
    assert head["Metadata"] == meta
    assert head["ContentType"] == "text/x-bulwark; charset=utf-8"
    got = s3.get_object(Bucket=bucket, Key="m")
    assert got["Metadata"] == meta
    assert got["ContentType"] == "text/x-bulwark; charset=utf-8"
    assert got["Body"].read() == b"payload"


def test_object_without_metadata_has_none(s3, bucket):
    s3.put_object(Bucket=bucket, Key="plain", Body=b"p")
    assert s3.head_object(Bucket=bucket, Key="plain")["Metadata"] == {}


KEYS_WITH_SPECIAL_CHARACTERS = [
    "with space.txt",
    "dir with spaces/nested file.bin",
    "plus+sign",
    "percent%20literal",
    "equals=and&ampersand",
    "unicode-ünïcødé-日本.txt",
    "semi;colon,comma",
    "tilde~and(parens)!*'",
    "dots/./in/../path",
]


def test_keys_with_special_characters(s3, bucket):
    for i, key in enumerate(KEYS_WITH_SPECIAL_CHARACTERS):
        s3.put_object(Bucket=bucket, Key=key, Body=f"body {i}".encode())
    for i, key in enumerate(KEYS_WITH_SPECIAL_CHARACTERS):
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == f"body {i}".encode(), key
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(f"body {i}")
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    expected = sorted(KEYS_WITH_SPECIAL_CHARACTERS, key=lambda k: k.encode())
    assert listed == expected
    listed = [o["Key"] for o in s3.list_objects(Bucket=bucket)["Contents"]]
    assert listed == expected
    for key in KEYS_WITH_SPECIAL_CHARACTERS:
        s3.delete_object(Bucket=bucket, Key=key)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_missing_key_errors(s3, bucket):
    expect_error(s3.get_object, "NoSuchKey", 404, Bucket=bucket, Key="nope")
    expect_error(s3.head_object, "404", 404, Bucket=bucket, Key="nope")
    expect_error(s3.get_object, "NoSuchKey", 404, Bucket=bucket, Key="nope", Range="bytes=0-1")
    expect_error(s3.copy_object, "NoSuchKey", 404, Bucket=bucket, Key="dst",
                 CopySource={"Bucket": bucket, "Key": "nope"})


# ---------------------------------------------------------------------------- ranges

RANGE_DATA = det_bytes("range-object", 1000)


@pytest.fixture
def range_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="ranged", Body=RANGE_DATA)
    return bucket, "ranged"


@pytest.mark.parametrize(
    "header,first,last",
    [
        ("bytes=0-0", 0, 0),
        ("bytes=0-9", 0, 9),
        ("bytes=10-19", 10, 19),
        ("bytes=990-999", 990, 999),
        ("bytes=500-", 500, 999),
        ("bytes=999-", 999, 999),
        ("bytes=-1", 999, 999),
        ("bytes=-100", 900, 999),
        ("bytes=-1000", 0, 999),
        ("bytes=-5000", 0, 999),  # suffix longer than the object: the whole object
        ("bytes=900-5000", 900, 999),  # end past the object: clamped
        ("bytes=0-999", 0, 999),
    ],
)
def test_range_get(s3, range_object, header, first, last):
    bkt, key = range_object
    got = s3.get_object(Bucket=bkt, Key=key, Range=header)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes {first}-{last}/1000"
    assert got["ContentLength"] == last - first + 1
    assert got["Body"].read() == RANGE_DATA[first:last + 1]
    # The ETag of a ranged read is the whole object's.
    assert got["ETag"] == quoted_md5(RANGE_DATA)


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=1000-1010", "bytes=5000-6000"])
def test_unsatisfiable_range(s3, range_object, header):
    bkt, key = range_object
    expect_error(s3.get_object, "InvalidRange", 416, Bucket=bkt, Key=key, Range=header)


def test_unsatisfiable_range_error_body(s3, range_object):
    """The raw 416 response carries S3 error XML naming InvalidRange."""
    from s3lib import parse_error_xml, signed_request

    bkt, key = range_object
    resp = signed_request("GET", f"/{bkt}/{key}", headers={"Range": "bytes=1000-"})
    assert resp.status_code == 416
    assert parse_error_xml(resp.content)["Code"] == "InvalidRange"


def test_range_on_empty_object_is_unsatisfiable(s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    expect_error(s3.get_object, "InvalidRange", 416, Bucket=bucket, Key="empty", Range="bytes=0-0")
    got = s3.get_object(Bucket=bucket, Key="empty")
    assert got["Body"].read() == b""
    assert got["ContentLength"] == 0


# ---------------------------------------------------------------------------- delete


def test_delete_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="gone", Body=b"bye")
    s3.put_object(Bucket=bucket, Key="stays", Body=b"hi")
    resp = s3.delete_object(Bucket=bucket, Key="gone")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    expect_error(s3.get_object, "NoSuchKey", 404, Bucket=bucket, Key="gone")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["stays"]
    # Deleting a key that does not exist succeeds in S3 (idempotent).
    resp = s3.delete_object(Bucket=bucket, Key="gone")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    resp = s3.delete_object(Bucket=bucket, Key="never-existed")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_delete_objects(s3, bucket):
    keys = [f"multi/{i:02d}" for i in range(10)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    doomed = keys[:7] + ["multi/does-not-exist"]
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed]})
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
    # S3 reports a key that did not exist as deleted too.
    assert sorted(d["Key"] for d in resp["Deleted"]) == sorted(doomed)
    assert resp.get("Errors", []) == []
    remaining = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert remaining == keys[7:]
    for k in keys[:7]:
        expect_error(s3.get_object, "NoSuchKey", 404, Bucket=bucket, Key=k)
    for k in keys[7:]:
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == k.encode()


def test_delete_objects_quiet(s3, bucket):
    for k in ("q1", "q2", "q3"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"q")
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "q1"}, {"Key": "q3"}],
                                                    "Quiet": True})
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
    # Quiet mode lists only failures (moto lists the deleted keys anyway).
    if not target().is_moto:
        assert resp.get("Deleted", []) == []
    assert resp.get("Errors", []) == []
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["q2"]


def test_delete_objects_in_missing_bucket(s3, new_bucket_name):
    expect_error(s3.delete_objects, "NoSuchBucket", 404, Bucket=new_bucket_name("missing"),
                 Delete={"Objects": [{"Key": "a"}]})


# ---------------------------------------------------------------------------- copy


def test_copy_object_keeps_data_and_metadata(s3, bucket):
    data = det_bytes("copy-source", 300_000)
    s3.put_object(Bucket=bucket, Key="src/original", Body=data, ContentType="image/x-test",
                  Metadata={"origin": "put", "n": "42"})
    resp = s3.copy_object(Bucket=bucket, Key="dst/copy",
                          CopySource={"Bucket": bucket, "Key": "src/original"})
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert resp["CopyObjectResult"]["ETag"] == quoted_md5(data)
    got = s3.get_object(Bucket=bucket, Key="dst/copy")
    assert got["Body"].read() == data
    assert got["ETag"] == quoted_md5(data)
    assert got["ContentType"] == "image/x-test"
    assert got["Metadata"] == {"origin": "put", "n": "42"}
    # The source is untouched.
    assert s3.get_object(Bucket=bucket, Key="src/original")["Body"].read() == data


def test_copy_object_replace_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="a", Body=b"abc", ContentType="text/plain",
                  Metadata={"old": "1"})
    s3.copy_object(Bucket=bucket, Key="b", CopySource={"Bucket": bucket, "Key": "a"},
                   MetadataDirective="REPLACE", Metadata={"new": "2"},
                   ContentType="application/x-new")
    head = s3.head_object(Bucket=bucket, Key="b")
    assert head["Metadata"] == {"new": "2"}
    assert head["ContentType"] == "application/x-new"
    assert head["ETag"] == quoted_md5(b"abc")
    assert s3.head_object(Bucket=bucket, Key="a")["Metadata"] == {"old": "1"}


def test_copy_object_onto_itself_with_new_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="self", Body=b"same bytes", Metadata={"v": "1"})
    s3.copy_object(Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"},
                   MetadataDirective="REPLACE", Metadata={"v": "2"})
    got = s3.get_object(Bucket=bucket, Key="self")
    assert got["Body"].read() == b"same bytes"
    assert got["Metadata"] == {"v": "2"}


def test_copy_object_across_buckets_and_special_keys(s3, bucket, new_bucket_name):
    other = new_bucket_name("copy")
    s3.create_bucket(Bucket=other)
    src_key = "dir with spaces/ünïcødé+plus.txt"
    s3.put_object(Bucket=bucket, Key=src_key, Body=b"across", Metadata={"k": "v"})
    s3.copy_object(Bucket=other, Key="copied/ü +.txt", CopySource={"Bucket": bucket, "Key": src_key})
    got = s3.get_object(Bucket=other, Key="copied/ü +.txt")
    assert got["Body"].read() == b"across"
    assert got["Metadata"] == {"k": "v"}


def test_copy_into_missing_bucket(s3, bucket, new_bucket_name):
    s3.put_object(Bucket=bucket, Key="a", Body=b"a")
    expect_error(s3.copy_object, "NoSuchBucket", 404, Bucket=new_bucket_name("missing"), Key="a",
                 CopySource={"Bucket": bucket, "Key": "a"})


# ---------------------------------------------------------------------------- size limit


def test_entity_too_large(s3, bucket):
    limit = target().max_object_bytes
    if limit is None:
        pytest.skip("S3_MAX_OBJECT_BYTES not set (the gateway is not configured with a maximum)")
    if limit > 64 * MiB:
        pytest.skip(f"S3_MAX_OBJECT_BYTES={limit} is too large to exercise quickly (> 64 MiB)")
    at_limit = det_bytes("at-limit", limit)
    s3.put_object(Bucket=bucket, Key="fits", Body=at_limit)
    assert s3.head_object(Bucket=bucket, Key="fits")["ContentLength"] == limit
    expect_error(s3.put_object, "EntityTooLarge", 400, Bucket=bucket, Key="too-big",
                 Body=at_limit + b"!")
    expect_error(s3.head_object, "404", 404, Bucket=bucket, Key="too-big")


def test_conditional_get_and_head_on_etag_and_dates(s3, bucket):
    s3.put_object(Bucket=bucket, Key="c", Body=b"conditional")
    head = s3.head_object(Bucket=bucket, Key="c")
    etag, modified = head["ETag"], head["LastModified"]
    day = datetime.timedelta(days=1)
    for call in (s3.get_object, s3.head_object):
        expect_error(call, "304", 304, Bucket=bucket, Key="c", IfNoneMatch=etag)
        expect_error(call, "304", 304, Bucket=bucket, Key="c", IfModifiedSince=modified)
        assert call(Bucket=bucket, Key="c", IfModifiedSince=modified - day)["ETag"] == etag
        expect_error(call, {"PreconditionFailed", "412"}, 412,
                     Bucket=bucket, Key="c", IfUnmodifiedSince=modified - day)
        assert call(Bucket=bucket, Key="c", IfUnmodifiedSince=modified + day)["ETag"] == etag
        # Each date yields to its ETag counterpart (RFC 9110 §13.2.2, as S3 documents it;
        # moto answers 412).
        if not target().is_moto:
            assert call(Bucket=bucket, Key="c", IfMatch=etag,
                        IfUnmodifiedSince=modified - day)["ETag"] == etag
    # A 304 carries the ETag a cache revalidates with.
    resp = signed_request("GET", f"/{bucket}/c", headers={"If-None-Match": etag})
    assert resp.status_code == 304, resp.status_code
    assert resp.headers.get("ETag") == etag, dict(resp.headers)


def test_an_object_stored_without_a_content_type_is_binary_octet_stream(s3, bucket):
    resp = signed_request("PUT", f"/{bucket}/untyped", body=b"no type given")
    assert resp.status_code == 200, resp.text
    assert s3.head_object(Bucket=bucket, Key="untyped")["ContentType"] == "binary/octet-stream"
    got = s3.get_object(Bucket=bucket, Key="untyped")
    assert got["ContentType"] == "binary/octet-stream"


def test_errors_carry_a_request_id(s3, bucket):
    from s3lib import parse_error_xml
    resp = signed_request("GET", f"/{bucket}/no-such-key")
    assert resp.status_code == 404
    fields = parse_error_xml(resp.content)
    assert fields["Code"] == "NoSuchKey"
    assert fields.get("RequestId"), fields
    if not target().is_moto:  # moto sends no x-amz-request-id header
        assert resp.headers.get("x-amz-request-id") == fields["RequestId"], dict(resp.headers)
        assert signed_request("GET", f"/{bucket}").headers.get("x-amz-request-id")


def test_response_headers_given_at_upload_come_back(s3, bucket):
    expires = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    given = dict(CacheControl="max-age=60", ContentDisposition='attachment; filename="a.txt"',
                 ContentEncoding="identity", ContentLanguage="de-CH", Expires=expires)
    s3.put_object(Bucket=bucket, Key="headers", Body=b"with headers", **given)
    for got in (s3.head_object(Bucket=bucket, Key="headers"),
                s3.get_object(Bucket=bucket, Key="headers")):
        assert got["CacheControl"] == "max-age=60"
        assert got["ContentDisposition"] == 'attachment; filename="a.txt"'
        assert got["ContentEncoding"] == "identity"
        assert got["ContentLanguage"] == "de-CH"
        assert got["Expires"] == expires
    # A copy keeps them; a copy that replaces the metadata replaces them too.
    s3.copy_object(Bucket=bucket, Key="headers-copy",
                   CopySource={"Bucket": bucket, "Key": "headers"})
    assert s3.head_object(Bucket=bucket, Key="headers-copy")["CacheControl"] == "max-age=60"
    s3.copy_object(Bucket=bucket, Key="headers-replaced", MetadataDirective="REPLACE",
                   CacheControl="no-store", CopySource={"Bucket": bucket, "Key": "headers"})
    replaced = s3.head_object(Bucket=bucket, Key="headers-replaced")
    assert replaced["CacheControl"] == "no-store"
    assert "ContentLanguage" not in replaced
    # A multipart upload's are given when it is created.
    up = s3.create_multipart_upload(Bucket=bucket, Key="headers-mp", CacheControl="private",
                                    ContentLanguage="fr")["UploadId"]
    e = s3.upload_part(Bucket=bucket, Key="headers-mp", UploadId=up, PartNumber=1,
                       Body=b"one part")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="headers-mp", UploadId=up,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e}]})
    got = s3.head_object(Bucket=bucket, Key="headers-mp")
    assert (got["CacheControl"], got["ContentLanguage"]) == ("private", "fr")

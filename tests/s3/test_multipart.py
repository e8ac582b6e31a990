"""Multipart upload: create, upload part, list parts, complete, abort; a 104 MiB upload."""

import hashlib

import pytest

from s3lib import (MiB, det_bytes, expect_error, md5_hex, multipart_etag, quoted_md5,
                   skip_on_moto, target)


def upload_ids(s3, bucket):
    resp = s3.list_multipart_uploads(Bucket=bucket)
    return [(u["Key"], u["UploadId"]) for u in resp.get("Uploads", [])]


def test_multipart_lifecycle(s3, bucket):
    parts = [det_bytes("mp-1", 5 * MiB), det_bytes("mp-2", 5 * MiB), det_bytes("mp-3", 1234)]
    created = s3.create_multipart_upload(Bucket=bucket, Key="big/object.bin",
                                         ContentType="application/x-multipart-test",
                                         Metadata={"kind": "multipart"})
    upload_id = created["UploadId"]
    assert upload_id
    assert created["Bucket"] == bucket
    assert created["Key"] == "big/object.bin"
    assert upload_ids(s3, bucket) == [("big/object.bin", upload_id)]

    # Not visible as an object while in progress.
    expect_error(s3.head_object, "404", 404, Bucket=bucket, Key="big/object.bin")

    etags = []
    # Upload out of order: part numbers, not arrival order, define the object.
    for number in (2, 1, 3):
        resp = s3.upload_part(Bucket=bucket, Key="big/object.bin", UploadId=upload_id,
                              PartNumber=number, Body=parts[number - 1])
        assert resp["ETag"] == quoted_md5(parts[number - 1])
        etags.append((number, resp["ETag"]))
    etags.sort()

    listed = s3.list_parts(Bucket=bucket, Key="big/object.bin", UploadId=upload_id)
    assert listed["UploadId"] == upload_id
    assert listed["IsTruncated"] is False
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed["Parts"]] == [
        (n, quoted_md5(parts[n - 1]), len(parts[n - 1])) for n in (1, 2, 3)
    ]

    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="big/object.bin", UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in etags]},
    )
    assert done["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert done["ETag"] == multipart_etag(parts)
    assert done["Key"] == "big/object.bin"
    assert done["Bucket"] == bucket

    whole = b"".join(parts)
    got = s3.get_object(Bucket=bucket, Key="big/object.bin")
    assert got["Body"].read() == whole
    assert got["ETag"] == multipart_etag(parts)
    assert got["ContentLength"] == len(whole)
    assert got["ContentType"] == "application/x-multipart-test"
    assert got["Metadata"] == {"kind": "multipart"}
    head = s3.head_object(Bucket=bucket, Key="big/object.bin")
    assert head["ETag"] == multipart_etag(parts)
    assert head["ContentLength"] == len(whole)
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [
        ("big/object.bin", len(whole), multipart_etag(parts))
    ]

    # Completed uploads are gone.
    assert upload_ids(s3, bucket) == []
    expect_error(s3.list_parts, "NoSuchUpload", 404, Bucket=bucket, Key="big/object.bin",
                 UploadId=upload_id)


def test_multipart_etag_format(s3, bucket):
    """ETag of a multipart object is md5(concatenated binary part md5s) in hex, then -N."""
    parts = [det_bytes("fmt-1", 5 * MiB), det_bytes("fmt-2", 7)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="fmt")["UploadId"]
    done_parts = []
    for i, p in enumerate(parts, start=1):
        e = s3.upload_part(Bucket=bucket, Key="fmt", UploadId=up, PartNumber=i, Body=p)["ETag"]
        done_parts.append({"PartNumber": i, "ETag": e})
    done = s3.complete_multipart_upload(Bucket=bucket, Key="fmt", UploadId=up,
                                        MultipartUpload={"Parts": done_parts})
    joined = hashlib.md5(parts[0]).digest() + hashlib.md5(parts[1]).digest()
    assert done["ETag"] == f'"{md5_hex(joined)}-2"'
    assert s3.head_object(Bucket=bucket, Key="fmt")["ETag"] == f'"{md5_hex(joined)}-2"'


def test_single_part_multipart_upload(s3, bucket):
    data = det_bytes("single", 100)
    up = s3.create_multipart_upload(Bucket=bucket, Key="one")["UploadId"]
    e = s3.upload_part(Bucket=bucket, Key="one", UploadId=up, PartNumber=1, Body=data)["ETag"]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="one", UploadId=up,
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e}]})
    assert done["ETag"] == multipart_etag([data])
    assert s3.get_object(Bucket=bucket, Key="one")["Body"].read() == data


def test_reuploading_a_part_replaces_it(s3, bucket):
    first, second, tail = det_bytes("r-1", 5 * MiB), det_bytes("r-1b", 5 * MiB), b"tail"
    up = s3.create_multipart_upload(Bucket=bucket, Key="re")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="re", UploadId=up, PartNumber=1, Body=first)
    e1 = s3.upload_part(Bucket=bucket, Key="re", UploadId=up, PartNumber=1, Body=second)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="re", UploadId=up, PartNumber=2, Body=tail)["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="re", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [
        (1, quoted_md5(second), 5 * MiB), (2, quoted_md5(tail), 4)]
    s3.complete_multipart_upload(Bucket=bucket, Key="re", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key="re")["Body"].read() == second + tail


def test_complete_with_subset_of_parts(s3, bucket):
    """Parts not named in CompleteMultipartUpload are not part of the object."""
    p1, p2, p3 = det_bytes("s-1", 5 * MiB), det_bytes("s-2", 5 * MiB), b"end"
    up = s3.create_multipart_upload(Bucket=bucket, Key="subset")["UploadId"]
    e = {}
    for n, p in ((1, p1), (2, p2), (3, p3)):
        e[n] = s3.upload_part(Bucket=bucket, Key="subset", UploadId=up, PartNumber=n, Body=p)["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="subset", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e[1]}, {"PartNumber": 3, "ETag": e[3]}]})
    got = s3.get_object(Bucket=bucket, Key="subset")
    assert got["Body"].read() == p1 + p3
    assert got["ETag"] == multipart_etag([p1, p3])


def test_complete_with_wrong_etag_is_invalid_part(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="bad")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="bad", UploadId=up, PartNumber=1, Body=b"data")
    expect_error(s3.complete_multipart_upload, "InvalidPart", 400, Bucket=bucket, Key="bad",
                 UploadId=up, MultipartUpload={"Parts": [
                     {"PartNumber": 1, "ETag": quoted_md5(b"other data")}]})
    expect_error(s3.complete_multipart_upload, "InvalidPart", 400, Bucket=bucket, Key="bad",
                 UploadId=up, MultipartUpload={"Parts": [
                     {"PartNumber": 2, "ETag": quoted_md5(b"data")}]})
    expect_error(s3.head_object, "404", 404, Bucket=bucket, Key="bad")


def test_complete_with_parts_out_of_order(s3, bucket):
    skip_on_moto("moto completes an upload whose parts are listed out of order")
    up = s3.create_multipart_upload(Bucket=bucket, Key="order")["UploadId"]
    p1, p2 = det_bytes("o-1", 5 * MiB), det_bytes("o-2", 5 * MiB)
    e1 = s3.upload_part(Bucket=bucket, Key="order", UploadId=up, PartNumber=1, Body=p1)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="order", UploadId=up, PartNumber=2, Body=p2)["ETag"]
    expect_error(s3.complete_multipart_upload, "InvalidPartOrder", 400, Bucket=bucket,
                 Key="order", UploadId=up, MultipartUpload={"Parts": [
                     {"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]})


def test_abort_removes_upload(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="aborted")["UploadId"]
    keep = s3.create_multipart_upload(Bucket=bucket, Key="kept")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="aborted", UploadId=up, PartNumber=1, Body=b"abc")
    assert sorted(upload_ids(s3, bucket)) == sorted([("aborted", up), ("kept", keep)])

    resp = s3.abort_multipart_upload(Bucket=bucket, Key="aborted", UploadId=up)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204

    assert upload_ids(s3, bucket) == [("kept", keep)]
    expect_error(s3.list_parts, "NoSuchUpload", 404, Bucket=bucket, Key="aborted", UploadId=up)
    if not target().is_moto:  # moto answers UploadPart to an unknown upload with a 500
        expect_error(s3.upload_part, "NoSuchUpload", 404, Bucket=bucket, Key="aborted",
                     UploadId=up, PartNumber=2, Body=b"late")
    if not target().is_moto:  # moto answers completing an aborted upload with a 500
        expect_error(s3.complete_multipart_upload, "NoSuchUpload", 404, Bucket=bucket,
                     Key="aborted", UploadId=up,
                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": quoted_md5(b"abc")}]})
    expect_error(s3.head_object, "404", 404, Bucket=bucket, Key="aborted")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)

    s3.abort_multipart_upload(Bucket=bucket, Key="kept", UploadId=keep)
    assert upload_ids(s3, bucket) == []


def test_unknown_upload_id(s3, bucket):
    bogus = "bulwark-no-such-upload-0000"
    expect_error(s3.list_parts, "NoSuchUpload", 404, Bucket=bucket, Key="k", UploadId=bogus)
    if not target().is_moto:  # moto answers UploadPart to an unknown upload with a 500
        expect_error(s3.upload_part, "NoSuchUpload", 404, Bucket=bucket, Key="k", UploadId=bogus,
                     PartNumber=1, Body=b"x")
    expect_error(s3.abort_multipart_upload, "NoSuchUpload", 404, Bucket=bucket, Key="k",
                 UploadId=bogus)


def test_list_parts_pagination(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="paged")["UploadId"]
    for n in range(1, 6):
        s3.upload_part(Bucket=bucket, Key="paged", UploadId=up, PartNumber=n, Body=bytes([n]) * n)
    first = s3.list_parts(Bucket=bucket, Key="paged", UploadId=up, MaxParts=2)
    assert [p["PartNumber"] for p in first["Parts"]] == [1, 2]
    assert first["IsTruncated"] is True
    assert first["NextPartNumberMarker"] == 2
    rest = s3.list_parts(Bucket=bucket, Key="paged", UploadId=up, PartNumberMarker=2)
    assert [(p["PartNumber"], p["Size"]) for p in rest["Parts"]] == [(3, 3), (4, 4), (5, 5)]
    assert rest["IsTruncated"] is False


# ---------------------------------------------------------------------------- 104 MiB

PART_SIZE = 8 * MiB
PART_COUNT = 13  # 104 MiB


def big_part(n: int) -> bytes:
    return det_bytes(f"bulwark-large-part-{n}", PART_SIZE)


@pytest.mark.slow
def test_large_multipart_upload(s3, bucket):
    key = "large/104MiB.bin"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    whole = hashlib.sha256()
    part_md5s = []
    done_parts = []
    # One part in memory at a time.
    for n in range(1, PART_COUNT + 1):
        data = big_part(n)
        whole.update(data)
        part_md5s.append(hashlib.md5(data).digest())
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=data)["ETag"]
        assert etag == f'"{hashlib.md5(data).hexdigest()}"'
        done_parts.append({"PartNumber": n, "ETag": etag})
        del data
    expected_etag = f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-{PART_COUNT}"'

    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=up)
    assert [(p["PartNumber"], p["Size"]) for p in listed["Parts"]] == [
        (n, PART_SIZE) for n in range(1, PART_COUNT + 1)]

    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                        MultipartUpload={"Parts": done_parts})
    assert done["ETag"] == expected_etag

    total = PART_SIZE * PART_COUNT
    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == total
    assert head["ETag"] == expected_etag

    # Full download, streamed and hashed.
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["ContentLength"] == total
    downloaded = hashlib.sha256()
    size = 0
    for chunk in got["Body"].iter_chunks(chunk_size=1 << 20):
        downloaded.update(chunk)
        size += len(chunk)
    assert size == total
    assert downloaded.hexdigest() == whole.hexdigest()

    # A ranged read across the boundary between parts 6 and 7.
    boundary = 6 * PART_SIZE
    first, last = boundary - 4096, boundary + 4095
    ranged = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")
    assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert ranged["ContentRange"] == f"bytes {first}-{last}/{total}"
    assert ranged["Body"].read() == big_part(6)[-4096:] + big_part(7)[:4096]

    # A range spanning three parts, and the object's last bytes.
    first, last = PART_SIZE - 10, 2 * PART_SIZE + 9
    ranged = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")
    assert ranged["Body"].read() == big_part(1)[-10:] + big_part(2) + big_part(3)[:10]
    ranged = s3.get_object(Bucket=bucket, Key=key, Range="bytes=-100")
    assert ranged["ContentRange"] == f"bytes {total - 100}-{total - 1}/{total}"
    assert ranged["Body"].read() == big_part(PART_COUNT)[-100:]


def test_completing_again_answers_the_same_result(s3, bucket):
    part = det_bytes("again", 1000)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="again")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="again", UploadId=upload_id, PartNumber=1,
                          Body=part)["ETag"]
    listing = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    first = s3.complete_multipart_upload(Bucket=bucket, Key="again", UploadId=upload_id,
                                         MultipartUpload=listing)
    # A client whose answer was lost completes again: S3 answers as it did the first time.
    again = s3.complete_multipart_upload(Bucket=bucket, Key="again", UploadId=upload_id,
                                         MultipartUpload=listing)
    assert again["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert again["ETag"] == first["ETag"] == multipart_etag([part])
    # Another listing is no repeat of that completion (moto answers it too).
    if not target().is_moto:
        other = {"Parts": [{"PartNumber": 1, "ETag": quoted_md5(b"other")}]}
        expect_error(s3.complete_multipart_upload, "NoSuchUpload", 404, Bucket=bucket,
                     Key="again", UploadId=upload_id, MultipartUpload=other)
    assert s3.get_object(Bucket=bucket, Key="again")["Body"].read() == part


def test_get_and_head_with_a_part_number_return_that_part(s3, bucket):
    skip_on_moto("moto does not answer partNumber with the part's bytes")
    parts = [det_bytes("pn-1", 5 * MiB), det_bytes("pn-2", 5 * MiB + 17), det_bytes("pn-3", 999)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="numbered")["UploadId"]
    done = []
    for number, data in enumerate(parts, start=1):
        e = s3.upload_part(Bucket=bucket, Key="numbered", UploadId=up, PartNumber=number,
                           Body=data)["ETag"]
        done.append({"PartNumber": number, "ETag": e})
    s3.complete_multipart_upload(Bucket=bucket, Key="numbered", UploadId=up,
                                 MultipartUpload={"Parts": done})
    total = sum(len(p) for p in parts)
    start = 0
    for number, data in enumerate(parts, start=1):
        got = s3.get_object(Bucket=bucket, Key="numbered", PartNumber=number)
        assert got["Body"].read() == data
        assert got["PartsCount"] == 3
        assert got["ContentRange"] == f"bytes {start}-{start + len(data) - 1}/{total}"
        head = s3.head_object(Bucket=bucket, Key="numbered", PartNumber=number)
        assert head["ContentLength"] == len(data)
        assert head["PartsCount"] == 3
        start += len(data)
    expect_error(s3.get_object, "InvalidPartNumber", 416, Bucket=bucket, Key="numbered",
                 PartNumber=4)
    expect_error(s3.get_object, "InvalidArgument", 400, Bucket=bucket, Key="numbered",
                 PartNumber=0)
    expect_error(s3.get_object, "InvalidRequest", 400, Bucket=bucket, Key="numbered",
                 PartNumber=1, Range="bytes=0-1")
    # A single-part object is its own part 1, and has no other.
    s3.put_object(Bucket=bucket, Key="single", Body=b"just one")
    assert s3.get_object(Bucket=bucket, Key="single", PartNumber=1)["Body"].read() == b"just one"
    expect_error(s3.head_object, "416", 416, Bucket=bucket, Key="single", PartNumber=2)


def test_upload_part_copy(s3, tgt, bucket):
    """UploadPartCopy: ranges and whole objects become parts that outlive their source."""
    source = det_bytes("copy-src", 6 * MiB + 77)
    s3.put_object(Bucket=bucket, Key="copy/src", Body=source)
    up = s3.create_multipart_upload(Bucket=bucket, Key="copy/dst")["UploadId"]

    first = s3.upload_part_copy(Bucket=bucket, Key="copy/dst", UploadId=up, PartNumber=1,
                                CopySource={"Bucket": bucket, "Key": "copy/src"},
                                CopySourceRange=f"bytes=0-{5 * MiB - 1}")
    assert first["CopyPartResult"]["ETag"] == quoted_md5(source[:5 * MiB])
    second = s3.upload_part_copy(Bucket=bucket, Key="copy/dst", UploadId=up, PartNumber=2,
                                 CopySource={"Bucket": bucket, "Key": "copy/src"})
    assert second["CopyPartResult"]["ETag"] == quoted_md5(source)

    # moto copies whatever range it is given.
    for bad in () if tgt.is_moto else (f"bytes=0-{len(source)}", "bytes=10-5", "bytes=5-", "5-10"):
        expect_error(s3.upload_part_copy, "InvalidArgument", 400, Bucket=bucket, Key="copy/dst",
                     UploadId=up, PartNumber=3, CopySourceRange=bad,
                     CopySource={"Bucket": bucket, "Key": "copy/src"})
    if not tgt.is_moto:  # moto copies whatever the conditions say
        expect_error(s3.upload_part_copy, "PreconditionFailed", 412, Bucket=bucket,
                     Key="copy/dst", UploadId=up, PartNumber=3,
                     CopySource={"Bucket": bucket, "Key": "copy/src"},
                     CopySourceIfMatch='"00000000000000000000000000000000"')
    # moto answers a bare 404.
    expect_error(s3.upload_part_copy, {"NoSuchKey", "404"} if tgt.is_moto else "NoSuchKey", 404,
                 Bucket=bucket, Key="copy/dst", UploadId=up, PartNumber=3,
                 CopySource={"Bucket": bucket, "Key": "copy/none"})

    # The parts hold their own bytes: the source may go.
    s3.delete_object(Bucket=bucket, Key="copy/src")
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="copy/dst", UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first["CopyPartResult"]["ETag"]},
                                   {"PartNumber": 2, "ETag": second["CopyPartResult"]["ETag"]}]},
    )
    assert done["ETag"] == multipart_etag([source[:5 * MiB], source])
    got = s3.get_object(Bucket=bucket, Key="copy/dst")["Body"].read()
    assert got == source[:5 * MiB] + source

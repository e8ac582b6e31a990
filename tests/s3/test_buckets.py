"""Buckets: create, list, head, delete (only when empty), and their errors."""

import pytest
from botocore.exceptions import ClientError

from s3lib import error_of, expect_error, signed_request, skip_on_moto, target


def bucket_names(s3):
    return [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_create_head_list_delete(s3, new_bucket_name):
    name = new_bucket_name()
    assert name not in bucket_names(s3)

    resp = s3.create_bucket(Bucket=name)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200

    assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
    listed = s3.list_buckets()
    entries = [b for b in listed["Buckets"] if b["Name"] == name]
    assert len(entries) == 1
    assert "CreationDate" in entries[0]

    resp = s3.delete_bucket(Bucket=name)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert name not in bucket_names(s3)
    # HEAD has no body, so botocore reports the bare status as the code.
    expect_error(s3.head_bucket, "404", 404, Bucket=name)


def test_list_buckets_shows_every_new_bucket(s3, new_bucket_name):
    names = [new_bucket_name("l") for _ in range(3)]
    for n in names:
        s3.create_bucket(Bucket=n)
    listed = bucket_names(s3)
    assert all(n in listed for n in names)
    assert len(listed) == len(set(listed)), "a bucket is listed twice"
    if not target().is_moto:  # moto lists buckets in creation order
        assert listed == sorted(listed), "ListBuckets is sorted by name in S3"


def test_delete_non_empty_bucket_is_refused(s3, new_bucket_name):
    name = new_bucket_name()
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="keep/me", Body=b"x")

    expect_error(s3.delete_bucket, "BucketNotEmpty", 409, Bucket=name)
    # Still there, object intact.
    assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=name, Key="keep/me")["Body"].read() == b"x"

    s3.delete_object(Bucket=name, Key="keep/me")
    assert s3.delete_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 204
    expect_error(s3.head_bucket, "404", 404, Bucket=name)


def test_recreate_existing_bucket_keeps_its_objects(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"still here")
    # S3 answers 409 BucketAlreadyOwnedByYou, but 200 in us-east-1 for legacy reasons; the
    # bucket and its objects survive either way.
    region = s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"
    if region == "us-east-1":
        assert s3.create_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    else:
        expect_error(s3.create_bucket, "BucketAlreadyOwnedByYou", 409, Bucket=bucket)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"still here"


def test_missing_bucket_errors(s3, new_bucket_name):
    name = new_bucket_name("missing")  # never created
    expect_error(s3.delete_bucket, "NoSuchBucket", 404, Bucket=name)
    expect_error(s3.head_bucket, "404", 404, Bucket=name)
    expect_error(s3.list_objects_v2, "NoSuchBucket", 404, Bucket=name)
    expect_error(s3.list_objects, "NoSuchBucket", 404, Bucket=name)
    expect_error(s3.put_object, "NoSuchBucket", 404, Bucket=name, Key="k", Body=b"x")
    expect_error(s3.get_object, "NoSuchBucket", 404, Bucket=name, Key="k")
    expect_error(s3.create_multipart_upload, "NoSuchBucket", 404, Bucket=name, Key="k")


def test_invalid_bucket_names_are_rejected(s3, new_bucket_name):
    skip_on_moto("moto accepts bucket names that break S3's naming rules")
    suffix = new_bucket_name("x")[-24:]
    for bad in ("ab", "UpperCase-" + suffix, "under_score-" + suffix, "-leading-dash-" + suffix):
        try:
            s3.create_bucket(Bucket=bad)
        except ClientError as e:
            assert error_of(e) == ("InvalidBucketName", 400), (bad, e.response.get("Error"))
        else:
            s3.delete_bucket(Bucket=bad)  # do not leave a wrongly accepted bucket behind
            pytest.fail(f"bucket name {bad!r} was accepted")


def test_list_buckets_pages_by_max_buckets_and_continuation_token(s3, new_bucket_name):
    skip_on_moto("moto lists buckets in creation order")
    names = sorted(new_bucket_name("p") for _ in range(3))
    for n in names:
        s3.create_bucket(Bucket=n)
    prefix = names[0][: names[0].rindex("-")]
    seen, token = [], None
    for _ in range(10):
        kwargs = {"MaxBuckets": 2, "Prefix": prefix}
        if token:
            kwargs["ContinuationToken"] = token
        resp = s3.list_buckets(**kwargs)
        page = [b["Name"] for b in resp["Buckets"]]
        assert len(page) <= 2
        seen += page
        token = resp.get("ContinuationToken")
        if not token:
            break
    assert seen == names
    # boto3 will not send it; S3 refuses max-buckets outside 1..10000.
    resp = signed_request("GET", "/", query="max-buckets=0")
    assert resp.status_code == 400 and "InvalidArgument" in resp.text, resp.text

"""Object and bucket tagging: set with the object (x-amz-tagging) or afterwards, returned,
replaced, copied or replaced by a copy's tagging directive, and bounded as S3 bounds them."""

import os

from s3lib import MiB, expect_error, skip_on_moto


def _tags(resp) -> dict:
    return {t["Key"]: t["Value"] for t in resp["TagSet"]}


def test_object_tags_round_trip(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"v", Tagging="team=blue&empty=")
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="k")) == {"team": "blue", "empty": ""}
    assert s3.get_object(Bucket=bucket, Key="k")["TagCount"] == 2
    s3.put_object_tagging(Bucket=bucket, Key="k",
                          Tagging={"TagSet": [{"Key": "a b", "Value": "c=d/e@f"}]})
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="k")) == {"a b": "c=d/e@f"}
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    s3.delete_object_tagging(Bucket=bucket, Key="k")
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == []
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="k")
    # An overwrite brings its own tags.
    s3.put_object(Bucket=bucket, Key="k", Body=b"w", Tagging="x=1")
    s3.put_object(Bucket=bucket, Key="k", Body=b"w")
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == []
    expect_error(s3.get_object_tagging, "NoSuchKey", 404, Bucket=bucket, Key="none")


def test_tag_limits_are_s3s(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    too_many = [{"Key": f"k{i}", "Value": ""} for i in range(11)]
    expect_error(s3.put_object_tagging, {"InvalidTag", "BadRequest"}, 400, Bucket=bucket,
                 Key="k", Tagging={"TagSet": too_many})
    expect_error(s3.put_object_tagging, "InvalidTag", 400, Bucket=bucket, Key="k",
                 Tagging={"TagSet": [{"Key": "a" * 129, "Value": ""}]})
    expect_error(s3.put_object_tagging, "InvalidTag", 400, Bucket=bucket, Key="k",
                 Tagging={"TagSet": [{"Key": "a", "Value": "v" * 257}]})
    expect_error(s3.put_object_tagging, "InvalidTag", 400, Bucket=bucket, Key="k",
                 Tagging={"TagSet": [{"Key": "a", "Value": "x&y"}]})
    skip_on_moto("moto takes a repeated tag key")
    expect_error(s3.put_object_tagging, "InvalidTag", 400, Bucket=bucket, Key="k",
                 Tagging={"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]})
    expect_error(s3.put_object, "InvalidTag", 400, Bucket=bucket, Key="k2", Body=b"v",
                 Tagging="&".join(f"k{i}=v" for i in range(11)))


def test_copies_and_multipart_uploads_carry_tags(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"data", Tagging="from=src")
    s3.copy_object(Bucket=bucket, Key="kept", CopySource={"Bucket": bucket, "Key": "src"})
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="kept")) == {"from": "src"}
    s3.copy_object(Bucket=bucket, Key="replaced", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="new=1")
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="replaced")) == {"new": "1"}
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp", Tagging="mp=yes")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1,
                          Body=os.urandom(MiB))["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="mp")) == {"mp": "yes"}


def test_tagging_an_encrypted_object_needs_no_key(s3, bucket):
    key = os.urandom(32)
    s3.put_object(Bucket=bucket, Key="k", Body=b"secret", SSECustomerAlgorithm="AES256",
                  SSECustomerKey=key)
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]})
    assert _tags(s3.get_object_tagging(Bucket=bucket, Key="k")) == {"a": "b"}
    got = s3.get_object(Bucket=bucket, Key="k", SSECustomerAlgorithm="AES256", SSECustomerKey=key)
    assert got["Body"].read() == b"secret"


def test_bucket_tags_round_trip(s3, bucket):
    expect_error(s3.get_bucket_tagging, "NoSuchTagSet", 404, Bucket=bucket)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "cost", "Value": "7"}]})
    assert _tags(s3.get_bucket_tagging(Bucket=bucket)) == {"cost": "7"}
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    s3.delete_bucket_tagging(Bucket=bucket)
    expect_error(s3.get_bucket_tagging, "NoSuchTagSet", 404, Bucket=bucket)
    expect_error(s3.get_bucket_tagging, "NoSuchBucket", 404, Bucket=bucket + "-none")

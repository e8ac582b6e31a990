"""Causal buckets, a Bulwark extension: a bucket created with `x-bulwark-consistency: causal` keeps
its objects in a causal volume (Depot) of the same name (crates/gateway/src/causal.rs)."""

from s3lib import MiB, det_bytes, expect_error, make_client, md5_hex, skip_on_moto

HEADER = "x-bulwark-consistency"


def client_creating(consistency: str):
    """A client whose CreateBucket carries the consistency header."""
    client = make_client()

    def add_header(request, **_):
        request.headers[HEADER] = consistency

    client.meta.events.register("before-sign.s3.CreateBucket", add_header)
    return client


def test_a_causal_bucket_serves_objects_and_lists_its_volume(s3, new_bucket_name):
    skip_on_moto("a Bulwark extension")
    name = new_bucket_name("causal")
    client_creating("causal").create_bucket(Bucket=name)
    small = b"hello"
    large = det_bytes("causal", 5 * MiB + 3)
    s3.put_object(Bucket=name, Key="a/small", Body=small)
    s3.put_object(Bucket=name, Key="a/large", Body=large)
    s3.put_object(Bucket=name, Key="top", Body=b"x")

    got = s3.get_object(Bucket=name, Key="a/large")
    assert got["Body"].read() == large
    headers = got["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-bulwark-versions"] == "1", headers
    assert "x-bulwark-other-versions" not in headers
    across = s3.get_object(Bucket=name, Key="a/large", Range="bytes=4194300-4194310")
    assert across["Body"].read() == large[4194300:4194311]
    head = s3.head_object(Bucket=name, Key="a/small")
    assert head["ContentLength"] == len(small)
    assert head["ETag"] == f'"{md5_hex(small)}"'

    listed = s3.list_objects_v2(Bucket=name, Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["a/"]
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [("top", 1)]
    page = s3.list_objects_v2(Bucket=name, Prefix="a/", MaxKeys=1)
    assert page["IsTruncated"]
    assert [o["Key"] for o in page["Contents"]] == ["a/large"]
    rest = s3.list_objects_v2(
        Bucket=name, Prefix="a/", ContinuationToken=page["NextContinuationToken"]
    )
    assert [(o["Key"], o["Size"]) for o in rest["Contents"]] == [("a/small", len(small))]
    assert not rest["IsTruncated"]
    v1 = s3.list_objects(Bucket=name, Prefix="a/")
    assert [o["Key"] for o in v1["Contents"]] == ["a/large", "a/small"]

    # A write supersedes what the gateway has seen; a delete too.
    s3.put_object(Bucket=name, Key="top", Body=b"y")
    assert s3.get_object(Bucket=name, Key="top")["Body"].read() == b"y"
    s3.delete_object(Bucket=name, Key="top")
    expect_error(s3.get_object, "NoSuchKey", 404, Bucket=name, Key="top")
    assert "top" not in [o["Key"] for o in s3.list_objects_v2(Bucket=name).get("Contents", [])]

    # What a causal bucket does not serve is refused, never half done.
    expect_error(s3.create_multipart_upload, "NotImplemented", 501, Bucket=name, Key="m")
    expect_error(
        s3.copy_object,
        "NotImplemented",
        501,
        Bucket=name,
        Key="copy",
        CopySource={"Bucket": name, "Key": "a/small"},
    )
    expect_error(s3.delete_bucket, "BucketNotEmpty", 409, Bucket=name)


def test_the_consistency_is_named_exactly_and_fixed_at_creation(s3, new_bucket_name):
    skip_on_moto("a Bulwark extension")
    name = new_bucket_name("causal")
    expect_error(client_creating("eventual").create_bucket, "InvalidArgument", 400, Bucket=name)
    client_creating("registers").create_bucket(Bucket=name)
    expect_error(
        client_creating("causal").create_bucket, "BucketAlreadyExists", 409, Bucket=name
    )

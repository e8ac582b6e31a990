"""Object versions of unversioned buckets: every object has one version, `null`, the latest.
ListObjectVersions lists them so that tools which empty a bucket through its versions work;
versioning itself is not served, and enabling it is refused rather than ignored.
"""

import pytest
from botocore.exceptions import ClientError

from s3lib import error_of, expect_error, skip_on_moto


def test_an_unversioned_buckets_objects_are_listed_as_null_versions(s3, bucket):
    keys = ["a", "b/1", "b/2", "c"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    listed = s3.list_object_versions(Bucket=bucket)
    assert [v["Key"] for v in listed["Versions"]] == keys
    assert {v["VersionId"] for v in listed["Versions"]} == {"null"}
    assert all(v["IsLatest"] for v in listed["Versions"])
    assert [v["Size"] for v in listed["Versions"]] == [len(k) for k in keys]
    assert "DeleteMarkers" not in listed and not listed["IsTruncated"]
    # Pages, by key marker.
    first = s3.list_object_versions(Bucket=bucket, MaxKeys=2)
    assert first["IsTruncated"] and [v["Key"] for v in first["Versions"]] == keys[:2]
    assert first["NextVersionIdMarker"] == "null"
    rest = s3.list_object_versions(Bucket=bucket, KeyMarker=first["NextKeyMarker"],
                                   VersionIdMarker=first["NextVersionIdMarker"])
    assert [v["Key"] for v in rest["Versions"]] == keys[2:]
    # Prefix and delimiter.
    grouped = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [v["Key"] for v in grouped["Versions"]] == ["a", "c"]
    assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == ["b/"]
    assert [v["Key"] for v in s3.list_object_versions(Bucket=bucket, Prefix="b/")["Versions"]] \
        == ["b/1", "b/2"]


def test_a_bucket_emptied_through_its_versions_can_be_deleted(s3, new_bucket_name):
    name = new_bucket_name("v")
    s3.create_bucket(Bucket=name)
    for i in range(5):
        s3.put_object(Bucket=name, Key=f"k{i}", Body=b"x")
    # What cleanup tools do: every version and delete marker, deleted by id.
    doomed = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name,
                                                                  PaginationConfig={"PageSize": 2}):
        doomed += [{"Key": v["Key"], "VersionId": v["VersionId"]}
                   for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
    assert len(doomed) == 5
    resp = s3.delete_objects(Bucket=name, Delete={"Objects": doomed})
    assert not resp.get("Errors"), resp
    s3.delete_bucket(Bucket=name)


def test_versioning_status_is_reported_and_enabling_is_refused(s3, bucket):
    status = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in status, status
    expect_error(s3.get_bucket_versioning, "NoSuchBucket", 404, Bucket=bucket + "-none")
    skip_on_moto("moto versions buckets")
    for state in ("Enabled", "Suspended"):
        with pytest.raises(ClientError) as info:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": state})
        assert error_of(info.value) == ("NotImplemented", 501), info.value.response
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)


def test_a_version_id_marker_needs_a_key_marker(s3, bucket):
    skip_on_moto("moto does not check version-id markers")
    expect_error(s3.list_object_versions, "InvalidArgument", 400, Bucket=bucket,
                 VersionIdMarker="null")

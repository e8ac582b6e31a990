"""Object versions. In an unversioned bucket every object has one version, `null`, the latest,
and ListObjectVersions lists them so that tools which empty a bucket through its versions work.
In a versioned bucket every write makes a version and a delete a delete marker; versions are
read, copied, tagged and deleted by id, and suspended versioning writes the `null` version.
"""

import pytest
from botocore.exceptions import ClientError

from s3lib import error_of, expect_error, skip_on_moto, target


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


def test_versioning_is_reported_enabled_and_suspended(s3, bucket):
    status = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in status, status
    expect_error(s3.get_bucket_versioning, "NoSuchBucket", 404, Bucket=bucket + "-none")
    for state in ("Enabled", "Suspended", "Enabled"):
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": state})
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == state
    skip_on_moto("moto accepts MFA delete")
    with pytest.raises(ClientError) as info:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={
            "Status": "Enabled", "MFADelete": "Enabled"})
    assert error_of(info.value)[1] in (400, 501), info.value.response
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"


def _versioned(s3, bucket):
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return bucket


def _versions(s3, bucket, **kwargs):
    listed = s3.list_object_versions(Bucket=bucket, **kwargs)
    return ([(v["Key"], v["VersionId"], v["IsLatest"]) for v in listed.get("Versions", [])],
            [(m["Key"], m["VersionId"], m["IsLatest"]) for m in listed.get("DeleteMarkers", [])])


def test_every_put_makes_a_version_read_back_by_its_id(s3, bucket):
    _versioned(s3, bucket)
    ids = [s3.put_object(Bucket=bucket, Key="k", Body=f"v{i}".encode())["VersionId"]
           for i in range(3)]
    assert len(set(ids)) == 3 and "null" not in ids
    for i, vid in enumerate(ids):
        got = s3.get_object(Bucket=bucket, Key="k", VersionId=vid)
        assert got["Body"].read() == f"v{i}".encode() and got["VersionId"] == vid
        assert s3.head_object(Bucket=bucket, Key="k", VersionId=vid)["VersionId"] == vid
    latest = s3.get_object(Bucket=bucket, Key="k")
    assert latest["Body"].read() == b"v2" and latest["VersionId"] == ids[2]
    versions, markers = _versions(s3, bucket)
    assert versions == [("k", ids[2], True), ("k", ids[1], False), ("k", ids[0], False)]
    assert markers == []
    skip_on_moto("moto's version ids are random")
    # Bulwark's ids follow the order the object's register took the writes.
    assert ids == sorted(ids)


def test_a_delete_makes_a_marker_and_deleting_the_marker_brings_the_object_back(s3, bucket):
    _versioned(s3, bucket)
    vid = s3.put_object(Bucket=bucket, Key="k", Body=b"kept")["VersionId"]
    deleted = s3.delete_object(Bucket=bucket, Key="k")
    assert deleted["DeleteMarker"] is True
    marker = deleted["VersionId"]
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=bucket, Key="k")
    assert error_of(info.value) == ("NoSuchKey", 404)
    headers = info.value.response["ResponseMetadata"]["HTTPHeaders"]
    # moto does not say why the key is missing; S3 does.
    assert target().is_moto or headers.get("x-amz-delete-marker") == "true"
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)
    versions, markers = _versions(s3, bucket)
    assert versions == [("k", vid, False)] and markers == [("k", marker, True)]
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=bucket, Key="k", VersionId=marker)
    # S3 answers 405 for a delete marker asked for by id; moto 404.
    assert error_of(info.value)[1] == (404 if target().is_moto else 405)
    # The old version is still there by id, and comes back when the marker goes.
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=vid)["Body"].read() == b"kept"
    gone = s3.delete_object(Bucket=bucket, Key="k", VersionId=marker)
    assert gone["VersionId"] == marker
    # S3 says the version deleted was a marker; moto does not.
    assert target().is_moto or gone["DeleteMarker"] is True
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"


def test_versions_deleted_by_id_are_gone_and_the_newest_left_is_current(s3, bucket):
    _versioned(s3, bucket)
    ids = [s3.put_object(Bucket=bucket, Key="k", Body=f"v{i}".encode())["VersionId"]
           for i in range(3)]
    s3.delete_object(Bucket=bucket, Key="k", VersionId=ids[2])
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v1"
    s3.delete_object(Bucket=bucket, Key="k", VersionId=ids[0])
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=bucket, Key="k", VersionId=ids[0])
    assert error_of(info.value)[1] in (400, 404)
    assert _versions(s3, bucket) == ([("k", ids[1], True)], [])
    # Multi-object delete by id, naming what it deleted.
    resp = s3.delete_objects(Bucket=bucket,
                             Delete={"Objects": [{"Key": "k", "VersionId": ids[1]}]})
    assert [(d["Key"], d["VersionId"]) for d in resp["Deleted"]] == [("k", ids[1])]
    assert _versions(s3, bucket) == ([], [])


def test_a_bucket_with_versions_or_markers_is_not_empty(s3, new_bucket_name):
    name = new_bucket_name("v")
    s3.create_bucket(Bucket=name)
    _versioned(s3, name)
    s3.put_object(Bucket=name, Key="k", Body=b"x")
    s3.delete_object(Bucket=name, Key="k")
    expect_error(s3.delete_bucket, "BucketNotEmpty", 409, Bucket=name)
    versions, markers = _versions(s3, name)
    doomed = [{"Key": k, "VersionId": v} for k, v, _ in versions + markers]
    assert len(doomed) == 2
    assert not s3.delete_objects(Bucket=name, Delete={"Objects": doomed}).get("Errors")
    s3.delete_bucket(Bucket=name)


def test_suspended_versioning_writes_the_null_version_and_keeps_the_others(s3, bucket):
    _versioned(s3, bucket)
    kept = s3.put_object(Bucket=bucket, Key="k", Body=b"enabled")["VersionId"]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    for body in (b"null 1", b"null 2"):
        written = s3.put_object(Bucket=bucket, Key="k", Body=body)
        # moto names no version for a null one; S3 names it `null`.
        assert written.get("VersionId") == ("null" if not target().is_moto else None)
    skip_on_moto("moto drops the versions written while versioning was enabled")
    versions, _ = _versions(s3, bucket)
    assert versions == [("k", "null", True), ("k", kept, False)]
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"null 2"
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=kept)["Body"].read() == b"enabled"
    deleted = s3.delete_object(Bucket=bucket, Key="k")
    assert deleted["DeleteMarker"] is True and deleted["VersionId"] == "null"
    versions, markers = _versions(s3, bucket)
    assert versions == [("k", kept, False)] and markers == [("k", "null", True)]


def test_an_object_from_before_versioning_is_its_null_version(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"old")
    _versioned(s3, bucket)
    new = s3.put_object(Bucket=bucket, Key="k", Body=b"new")["VersionId"]
    versions, _ = _versions(s3, bucket)
    assert versions == [("k", new, True), ("k", "null", False)]
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"old"


def test_a_version_is_copied_and_tagged_by_its_id(s3, bucket):
    _versioned(s3, bucket)
    old = s3.put_object(Bucket=bucket, Key="k", Body=b"old")["VersionId"]
    s3.put_object(Bucket=bucket, Key="k", Body=b"new")
    copied = s3.copy_object(Bucket=bucket, Key="copy",
                            CopySource={"Bucket": bucket, "Key": "k", "VersionId": old})
    assert copied["CopySourceVersionId"] == old and copied["VersionId"]
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"old"
    s3.put_object_tagging(Bucket=bucket, Key="k", VersionId=old,
                          Tagging={"TagSet": [{"Key": "era", "Value": "old"}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="k", VersionId=old)["TagSet"] == \
        [{"Key": "era", "Value": "old"}]
    current = s3.get_object_tagging(Bucket=bucket, Key="k")
    assert current["TagSet"] == []
    assert target().is_moto or current["VersionId"] not in (None, old)
    skip_on_moto("moto answers a copy of a delete marker named by id with NoSuchVersion")
    marker = s3.delete_object(Bucket=bucket, Key="k")["VersionId"]
    expect_error(s3.copy_object, "InvalidRequest", 400, Bucket=bucket, Key="copy",
                 CopySource={"Bucket": bucket, "Key": "k", "VersionId": marker})
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=old)["Body"].read() == b"old"


def test_a_multipart_upload_makes_a_version(s3, bucket):
    _versioned(s3, bucket)
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"single")["VersionId"]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload, PartNumber=1, Body=b"parts")
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="k", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert done["VersionId"] not in (None, first)
    versions, _ = _versions(s3, bucket)
    assert versions == [("k", done["VersionId"], True), ("k", first, False)]


def test_versions_page_by_key_and_version_id_markers(s3, bucket):
    _versioned(s3, bucket)
    for key in ("a", "b"):
        for i in range(3):
            s3.put_object(Bucket=bucket, Key=key, Body=bytes([i]))
    everything, _ = _versions(s3, bucket)
    assert len(everything) == 6
    seen = []
    for page in s3.get_paginator("list_object_versions").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 2}):
        seen += [(v["Key"], v["VersionId"], v["IsLatest"]) for v in page.get("Versions", [])]
    assert seen == everything


def test_a_version_id_marker_needs_a_key_marker(s3, bucket):
    skip_on_moto("moto does not check version-id markers")
    expect_error(s3.list_object_versions, "InvalidArgument", 400, Bucket=bucket,
                 VersionIdMarker="null")

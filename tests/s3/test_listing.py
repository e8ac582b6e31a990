"""ListObjects (v1) and ListObjectsV2: prefix, delimiter, CommonPrefixes, pagination, MaxKeys."""

import pytest

from s3lib import det_bytes, quoted_md5, skip_on_moto, target

# Sorted in S3 order (by UTF-8 bytes). Sizes differ so that listed sizes are checked too.
KEYS = [
    "a.txt",
    "dir1/b.txt",
    "dir1/c.txt",
    "dir1/sub/d.txt",
    "dir1/sub/e.txt",
    "dir2/f.txt",
    "dir2/sub/g.txt",
    "dir3-not-a-dir.txt",
    "z.txt",
]


def body(key):
    return det_bytes("listing-" + key, 10 + KEYS.index(key) * 3)


@pytest.fixture
def populated(s3, bucket):
    for k in KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=body(k))
    return bucket


def keys_of(resp):
    return [o["Key"] for o in resp.get("Contents", [])]


def prefixes_of(resp):
    return [p["Prefix"] for p in resp.get("CommonPrefixes", [])]


def test_list_all_v2(s3, populated):
    resp = s3.list_objects_v2(Bucket=populated)
    assert resp["IsTruncated"] is False
    assert resp["KeyCount"] == len(KEYS)
    assert resp["Name"] == populated
    assert [(o["Key"], o["Size"], o["ETag"]) for o in resp["Contents"]] == [
        (k, len(body(k)), quoted_md5(body(k))) for k in KEYS
    ]
    assert prefixes_of(resp) == []
    assert "NextContinuationToken" not in resp


def test_list_all_v1(s3, populated):
    resp = s3.list_objects(Bucket=populated)
    assert resp["IsTruncated"] is False
    assert resp["Name"] == populated
    assert [(o["Key"], o["Size"], o["ETag"]) for o in resp["Contents"]] == [
        (k, len(body(k)), quoted_md5(body(k))) for k in KEYS
    ]


def test_empty_bucket_listing(s3, bucket):
    resp = s3.list_objects_v2(Bucket=bucket)
    assert resp["KeyCount"] == 0
    assert resp["IsTruncated"] is False
    assert "Contents" not in resp
    resp = s3.list_objects(Bucket=bucket)
    assert resp["IsTruncated"] is False
    assert "Contents" not in resp


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize(
    "prefix,delimiter,contents,common",
    [
        ("dir1/", None, ["dir1/b.txt", "dir1/c.txt", "dir1/sub/d.txt", "dir1/sub/e.txt"], []),
        ("dir", None, KEYS[1:8], []),
        ("nothing-here/", None, [], []),
        ("", "/", ["a.txt", "dir3-not-a-dir.txt", "z.txt"], ["dir1/", "dir2/"]),
        ("dir1/", "/", ["dir1/b.txt", "dir1/c.txt"], ["dir1/sub/"]),
        ("dir1/sub/", "/", ["dir1/sub/d.txt", "dir1/sub/e.txt"], []),
        ("dir", "/", ["dir3-not-a-dir.txt"], ["dir1/", "dir2/"]),
        ("", ".", [], ["a.", "dir1/b.", "dir1/c.", "dir1/sub/d.", "dir1/sub/e.", "dir2/f.",
                       "dir2/sub/g.", "dir3-not-a-dir.", "z."]),
        ("dir2/", "sub", ["dir2/f.txt"], ["dir2/sub"]),
    ],
)
def test_prefix_and_delimiter(s3, populated, version, prefix, delimiter, contents, common):
    kwargs = {"Bucket": populated, "Prefix": prefix}
    if delimiter:
        kwargs["Delimiter"] = delimiter
    resp = (s3.list_objects_v2 if version == "v2" else s3.list_objects)(**kwargs)
    assert keys_of(resp) == contents
    assert prefixes_of(resp) == common
    assert resp["IsTruncated"] is False
    assert resp.get("Prefix", "") == prefix
    if delimiter:
        assert resp["Delimiter"] == delimiter
    if version == "v2":
        assert resp["KeyCount"] == len(contents) + len(common)


def paginate_v2(s3, **kwargs):
    pages, token = [], None
    for _ in range(50):
        args = dict(kwargs)
        if token:
            args["ContinuationToken"] = token
        resp = s3.list_objects_v2(**args)
        pages.append(resp)
        if not resp["IsTruncated"]:
            assert "NextContinuationToken" not in resp
            return pages
        token = resp["NextContinuationToken"]
        assert token
    raise AssertionError("pagination did not end")


def test_v2_pagination_max_keys(s3, populated):
    pages = paginate_v2(s3, Bucket=populated, MaxKeys=2)
    assert [keys_of(p) for p in pages] == [KEYS[0:2], KEYS[2:4], KEYS[4:6], KEYS[6:8], KEYS[8:9]]
    assert [p["KeyCount"] for p in pages] == [2, 2, 2, 2, 1]
    assert all(p["MaxKeys"] == 2 for p in pages)
    assert [p["IsTruncated"] for p in pages] == [True, True, True, True, False]


def test_v2_pagination_exact_multiple(s3, populated):
    # 9 keys, 3 per page: the third page is full and is the last one.
    pages = paginate_v2(s3, Bucket=populated, MaxKeys=3)
    assert [keys_of(p) for p in pages] == [KEYS[0:3], KEYS[3:6], KEYS[6:9]]


def test_v2_pagination_with_delimiter(s3, populated):
    # CommonPrefixes count towards MaxKeys and each appears once across pages.
    pages = paginate_v2(s3, Bucket=populated, Delimiter="/", MaxKeys=1)
    seen = [(keys_of(p), prefixes_of(p)) for p in pages]
    assert seen == [
        (["a.txt"], []),
        ([], ["dir1/"]),
        ([], ["dir2/"]),
        (["dir3-not-a-dir.txt"], []),
        (["z.txt"], []),
    ]


def test_v2_pagination_with_prefix(s3, populated):
    pages = paginate_v2(s3, Bucket=populated, Prefix="dir1/", MaxKeys=3)
    assert [keys_of(p) for p in pages] == [KEYS[1:4], KEYS[4:5]]


def test_v2_start_after(s3, populated):
    resp = s3.list_objects_v2(Bucket=populated, StartAfter="dir1/sub/d.txt")
    assert keys_of(resp) == KEYS[4:]
    assert resp["StartAfter"] == "dir1/sub/d.txt"
    resp = s3.list_objects_v2(Bucket=populated, StartAfter="dir1/c")  # not itself a key
    assert keys_of(resp) == KEYS[2:]
    resp = s3.list_objects_v2(Bucket=populated, StartAfter="zzz")
    assert keys_of(resp) == []


def test_v2_max_keys_large_and_default(s3, populated):
    resp = s3.list_objects_v2(Bucket=populated, MaxKeys=1000)
    assert keys_of(resp) == KEYS
    assert resp["MaxKeys"] == 1000
    resp = s3.list_objects_v2(Bucket=populated)
    assert resp["MaxKeys"] == 1000  # the default


def test_v2_fetch_owner_absent_by_default(s3, populated):
    resp = s3.list_objects_v2(Bucket=populated, MaxKeys=1)
    assert "Owner" not in resp["Contents"][0]


def test_v1_pagination_marker(s3, populated):
    # Without a delimiter S3 sends no NextMarker: the client continues after the last key.
    pages, marker = [], ""
    for _ in range(50):
        resp = s3.list_objects(Bucket=populated, MaxKeys=2, Marker=marker)
        pages.append(keys_of(resp))
        assert resp["MaxKeys"] == 2
        if not target().is_moto:  # moto does not echo Marker
            assert resp.get("Marker", "") == marker
        if not resp["IsTruncated"]:
            break
        last = resp["Contents"][-1]["Key"]
        if "NextMarker" in resp and not target().is_moto:  # moto sends an opaque NextMarker
            assert resp["NextMarker"] == last
        marker = last
    assert pages == [KEYS[0:2], KEYS[2:4], KEYS[4:6], KEYS[6:8], KEYS[8:9]]


def test_v1_pagination_with_delimiter_next_marker(s3, populated):
    skip_on_moto("moto's ListObjects v1 does not count CommonPrefixes towards MaxKeys")
    # With a delimiter, S3 returns NextMarker when truncated (the last key or common prefix).
    seen, marker = [], ""
    for _ in range(50):
        resp = s3.list_objects(Bucket=populated, MaxKeys=2, Delimiter="/", Marker=marker)
        seen.append((keys_of(resp), prefixes_of(resp)))
        if not resp["IsTruncated"]:
            break
        marker = resp["NextMarker"]
    assert seen == [
        (["a.txt"], ["dir1/"]),
        (["dir3-not-a-dir.txt"], ["dir2/"]),
        (["z.txt"], []),
    ]


def test_v1_marker_between_keys(s3, populated):
    resp = s3.list_objects(Bucket=populated, Marker="dir2/")
    assert keys_of(resp) == KEYS[5:]


def test_paginators_see_every_key_once(s3, populated):
    v2 = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=populated, PaginationConfig={"PageSize": 4}) for o in page.get("Contents", [])]
    v1 = [o["Key"] for page in s3.get_paginator("list_objects").paginate(
        Bucket=populated, PaginationConfig={"PageSize": 4}) for o in page.get("Contents", [])]
    assert v2 == KEYS
    assert v1 == KEYS


def test_v2_fetch_owner_names_the_owner(s3, populated):
    resp = s3.list_objects_v2(Bucket=populated, MaxKeys=2, FetchOwner=True)
    assert all("ID" in o.get("Owner", {}) for o in resp["Contents"]), resp["Contents"]


def test_v1_says_where_the_first_page_began_and_drops_an_empty_delimiter(s3, populated):
    skip_on_moto("moto does not echo Marker")
    resp = s3.list_objects(Bucket=populated)
    assert resp["Marker"] == ""
    resp = s3.list_objects(Bucket=populated, Delimiter="")
    assert "Delimiter" not in resp, resp.get("Delimiter")
    assert keys_of(resp) == KEYS and prefixes_of(resp) == []

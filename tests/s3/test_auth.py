"""Authentication: wrong secret, unknown access key, unsigned (anonymous) requests, presigned URLs."""

import urllib.parse

import pytest
import requests

from s3lib import expect_error, make_client, parse_error_xml, signed_request, skip_on_moto, target

NO_SIGNATURE_CHECK = "moto does not verify SigV4 signatures or access keys"


@pytest.fixture
def obj(s3, bucket):
    s3.put_object(Bucket=bucket, Key="secret.txt", Body=b"only for the key holder")
    return bucket, "secret.txt"


def test_wrong_secret_is_signature_does_not_match(s3, obj):
    skip_on_moto(NO_SIGNATURE_CHECK)
    bkt, key = obj
    bad = make_client(secret_key=target().secret_key + "x")
    expect_error(bad.list_buckets, "SignatureDoesNotMatch", 403)
    expect_error(bad.list_objects_v2, "SignatureDoesNotMatch", 403, Bucket=bkt)
    expect_error(bad.get_object, "SignatureDoesNotMatch", 403, Bucket=bkt, Key=key)
    expect_error(bad.put_object, "SignatureDoesNotMatch", 403, Bucket=bkt, Key=key, Body=b"evil")
    expect_error(bad.delete_object, "SignatureDoesNotMatch", 403, Bucket=bkt, Key=key)
    expect_error(bad.delete_bucket, "SignatureDoesNotMatch", 403, Bucket=bkt)
    # Nothing changed.
    assert s3.get_object(Bucket=bkt, Key=key)["Body"].read() == b"only for the key holder"


def test_unknown_access_key(s3, obj):
    skip_on_moto(NO_SIGNATURE_CHECK)
    bkt, key = obj
    stranger = make_client(access_key="AKIABULWARKUNKNOWN00", secret_key="not-a-real-secret")
    codes = {"InvalidAccessKeyId", "AccessDenied"}
    expect_error(stranger.list_buckets, codes, 403)
    expect_error(stranger.get_object, codes, 403, Bucket=bkt, Key=key)
    expect_error(stranger.put_object, codes, 403, Bucket=bkt, Key="intruder", Body=b"x")
    expect_error(s3.head_object, "404", 404, Bucket=bkt, Key="intruder")


def test_wrong_secret_raw_error_body(obj):
    skip_on_moto(NO_SIGNATURE_CHECK)
    bkt, key = obj
    resp = signed_request("GET", f"/{bkt}/{key}", secret_key=target().secret_key + "x")
    assert resp.status_code == 403
    assert parse_error_xml(resp.content)["Code"] == "SignatureDoesNotMatch"
    assert b"only for the key holder" not in resp.content


def _assert_anonymous_denied(resp):
    assert resp.status_code == 403, (resp.status_code, resp.content[:300])
    fields = parse_error_xml(resp.content)
    assert fields["Code"] == "AccessDenied", fields


@pytest.mark.parametrize("method,path_kind", [
    ("GET", "service"),
    ("GET", "bucket"),
    ("GET", "object"),
    ("HEAD", "object"),
    ("PUT", "object"),
    ("DELETE", "object"),
    ("DELETE", "bucket"),
])
def test_anonymous_requests_are_denied(s3, obj, method, path_kind):
    skip_on_moto("moto serves unsigned requests")
    bkt, key = obj
    path = {"service": "/", "bucket": f"/{bkt}", "object": f"/{bkt}/{key}"}[path_kind]
    url = target().endpoint + path
    resp = requests.request(method, url, data=b"anonymous" if method == "PUT" else None,
                            timeout=30, allow_redirects=False)
    if method == "HEAD":
        assert resp.status_code == 403
        assert resp.content == b""
    else:
        _assert_anonymous_denied(resp)
    # Nothing changed.
    assert s3.get_object(Bucket=bkt, Key=key)["Body"].read() == b"only for the key holder"
    assert s3.head_bucket(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_anonymous_with_urllib(obj):
    """The same through the standard library, so no client library shapes the request."""
    skip_on_moto("moto serves unsigned requests")
    import urllib.error
    import urllib.request

    bkt, key = obj
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{target().endpoint}/{bkt}/{urllib.parse.quote(key)}", timeout=30)
    assert info.value.code == 403
    assert parse_error_xml(info.value.read())["Code"] == "AccessDenied"


def test_malformed_authorization_header(obj):
    skip_on_moto("moto ignores the Authorization header")
    bkt, key = obj
    url = f"{target().endpoint}/{bkt}/{key}"
    for auth in ("AWS4-HMAC-SHA256 garbage", "Bearer abc", "AWS4-HMAC-SHA256 Credential=x"):
        resp = requests.get(url, headers={"Authorization": auth}, timeout=30)
        assert resp.status_code in (400, 403), resp.status_code
        fields = parse_error_xml(resp.content)
        assert b"only for the key holder" not in resp.content
        assert fields["Code"] in {"AuthorizationHeaderMalformed", "AccessDenied",
                                  "InvalidArgument", "SignatureDoesNotMatch",
                                  "InvalidAccessKeyId", "InvalidRequest"}, fields


def test_presigned_get(s3, obj):
    bkt, key = obj
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": key},
                                    ExpiresIn=300)
    resp = requests.get(url, timeout=30)
    assert resp.status_code == 200
    assert resp.content == b"only for the key holder"


def test_presigned_put(s3, bucket):
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "via-url"},
                                    ExpiresIn=300)
    resp = requests.put(url, data=b"uploaded through a presigned URL", timeout=30)
    assert resp.status_code == 200
    got = s3.get_object(Bucket=bucket, Key="via-url")["Body"].read()
    assert got == b"uploaded through a presigned URL"


def test_tampered_presigned_url_is_rejected(s3, obj):
    skip_on_moto(NO_SIGNATURE_CHECK)
    bkt, key = obj
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": key},
                                    ExpiresIn=300)
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    sig = dict(query)["X-Amz-Signature"]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    query = [(k, flipped if k == "X-Amz-Signature" else v) for k, v in query]
    bad = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    resp = requests.get(bad, timeout=30)
    assert resp.status_code == 403
    assert parse_error_xml(resp.content)["Code"] == "SignatureDoesNotMatch"
    # A presigned URL for one key does not open another.
    other = url.replace(f"/{key}?", "/other-key?")
    assert other != url
    resp = requests.get(other, timeout=30)
    assert resp.status_code == 403
    assert parse_error_xml(resp.content)["Code"] == "SignatureDoesNotMatch"


def test_presigned_urls_valid_for_more_than_a_week_or_negative_are_refused(s3, obj):
    skip_on_moto(NO_SIGNATURE_CHECK)
    bkt, key = obj
    week = 7 * 24 * 3600
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": key},
                                    ExpiresIn=week)
    assert requests.get(url, timeout=30).status_code == 200
    for expires in (week + 1, -1):
        url = s3.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": key},
                                        ExpiresIn=expires)
        assert f"X-Amz-Expires={expires}" in url, url
        resp = requests.get(url, timeout=30)
        assert resp.status_code == 403, (expires, resp.status_code, resp.content)
        assert b"only for the key holder" not in resp.content
        assert parse_error_xml(resp.content)["Code"] == "AuthorizationQueryParametersError"

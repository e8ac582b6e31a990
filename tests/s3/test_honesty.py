"""Nothing accepted and ignored: a request whose meaning the target does not implement is
refused (NotImplemented, InvalidArgument, InvalidRequest), never stored as if that part of it
were not there. Each test accepts either outcome, honoured or refused, and checks the one it got.
"""

import os

import pytest
import requests
from botocore.exceptions import ClientError

from s3lib import error_of, expect_error, signed_request, skip_on_moto

REFUSED = {"NotImplemented", "InvalidArgument", "InvalidRequest"}


def _put_or_refusal(fn, **kwargs):
    """The put's response, or None after checking it was refused as unsupported."""
    try:
        return fn(**kwargs)
    except ClientError as e:
        code, status = error_of(e)
        assert code in REFUSED and status in (400, 501), (code, status, e.response.get("Error"))
        return None


def _absent(s3, bucket, key):
    with pytest.raises(ClientError) as info:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_of(info.value)[1] == 404


def test_sse_c_is_honoured_or_refused(s3, bucket):
    skip_on_moto("moto serves an SSE-C object without its key")
    key = os.urandom(32)
    put = _put_or_refusal(s3.put_object, Bucket=bucket, Key="sse-c", Body=b"secret",
                          SSECustomerAlgorithm="AES256", SSECustomerKey=key)
    if put is None:
        _absent(s3, bucket, "sse-c")
        return
    # Honoured: without its key the object cannot be read.
    expect_error(s3.get_object, {"InvalidRequest", "InvalidArgument"}, 400,
                 Bucket=bucket, Key="sse-c")


def test_sse_s3_and_kms_are_honoured_or_refused(s3, bucket):
    for n, extra in enumerate([{"ServerSideEncryption": "AES256"},
                               {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k"}]):
        key = f"sse-{n}"
        put = _put_or_refusal(s3.put_object, Bucket=bucket, Key=key, Body=b"v", **extra)
        if put is None:
            _absent(s3, bucket, key)
        else:
            assert put.get("ServerSideEncryption") == extra["ServerSideEncryption"], put


def test_canned_acls_other_than_private_and_grants_are_honoured_or_refused(s3, bucket):
    assert s3.put_object(Bucket=bucket, Key="private", Body=b"v", ACL="private")
    cases = [{"ACL": "public-read"},
             {"GrantRead": 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'}]
    for n, extra in enumerate(cases):
        key = f"acl-{n}"
        put = _put_or_refusal(s3.put_object, Bucket=bucket, Key=key, Body=b"v", **extra)
        if put is None:
            _absent(s3, bucket, key)
        else:
            grants = s3.get_object_acl(Bucket=bucket, Key=key)["Grants"]
            assert any(g["Grantee"].get("URI", "").endswith("AllUsers") for g in grants), grants


def test_an_invented_version_id_is_refused_and_deletes_nothing(s3, bucket):
    skip_on_moto("moto acts on an unversioned object whatever version id is given")
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    invented = "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"
    for call in (s3.get_object, s3.head_object, s3.delete_object):
        with pytest.raises(ClientError) as info:
            call(Bucket=bucket, Key="k", VersionId=invented)
        code, status = error_of(info.value)
        assert status in (400, 404), (code, status)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    resp = s3.delete_objects(Bucket=bucket,
                             Delete={"Objects": [{"Key": "k", "VersionId": invented}]})
    assert resp.get("Errors") and not resp.get("Deleted"), resp
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_the_null_version_id_names_the_object_of_an_unversioned_bucket(s3, bucket):
    skip_on_moto("moto does not take the null version id of an unversioned object")
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"v"
    assert s3.head_object(Bucket=bucket, Key="k", VersionId="null")["ContentLength"] == 1
    s3.delete_object(Bucket=bucket, Key="k", VersionId="null")
    _absent(s3, bucket, "k")


def test_a_conditional_delete_is_honoured_or_refused(s3, bucket):
    skip_on_moto("moto ignores the ETag condition of a multi-object delete entry")
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    resp = signed_request("DELETE", f"/{bucket}/k", headers={"If-Match": '"not-its-etag"'})
    assert resp.status_code in (412, 501), (resp.status_code, resp.text)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"

    wrong = s3.delete_objects(Bucket=bucket,
                              Delete={"Objects": [{"Key": "k", "ETag": '"not-its-etag"'}]})
    assert wrong.get("Errors") and not wrong.get("Deleted"), wrong
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_a_browser_form_upload_is_honoured_or_refused(s3, bucket):
    post = s3.generate_presigned_post(bucket, "form")
    resp = requests.post(post["url"], data=post["fields"], files={"file": ("f", b"form data")},
                         timeout=60)
    if resp.status_code == 501:
        assert "NotImplemented" in resp.text, resp.text
        _absent(s3, bucket, "form")
    else:
        assert resp.status_code in (200, 201, 204), (resp.status_code, resp.text)
        assert s3.get_object(Bucket=bucket, Key="form")["Body"].read() == b"form data"

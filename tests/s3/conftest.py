"""Fixtures for the S3 compatibility suite; helpers live in s3lib.py."""

import pytest

from s3lib import BUCKET_PREFIX, empty_bucket, make_client, remove_bucket, target, unique_bucket_name


@pytest.fixture(scope="session")
def tgt():
    return target()


@pytest.fixture(scope="session")
def s3():
    return make_client()


@pytest.fixture
def new_bucket_name(s3):
    """Unique bucket names for tests that create buckets themselves; removed afterwards."""
    made = []

    def factory(tag: str = "b") -> str:
        name = unique_bucket_name(tag)
        made.append(name)
        return name

    yield factory
    for name in made:
        remove_bucket(s3, name)


@pytest.fixture
def bucket(s3):
    """A fresh, empty bucket for one test; emptied and deleted afterwards."""
    name = unique_bucket_name()
    s3.create_bucket(Bucket=name)
    yield name
    empty_bucket(s3, name)
    s3.delete_bucket(Bucket=name)


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftover_buckets():
    """At the end of the run, remove any bucket of this run a failed test left behind."""
    yield
    client = make_client()
    try:
        names = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    except Exception:  # the target may be gone; nothing more to do
        return
    for name in names:
        if name.startswith(BUCKET_PREFIX):
            remove_bucket(client, name)

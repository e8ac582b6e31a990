"""Smoke runs of real clients: aws-cli, rclone and s3cmd.

Each tool copies a deterministic directory tree in, lists it, copies it out to a fresh directory,
and the trees are compared byte for byte; then the tool deletes what it uploaded.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from s3lib import MiB, det_bytes, target

pytestmark = pytest.mark.slow

# Relative path -> size. Nested dirs, spaces, an empty file, and one file large enough for each
# tool's multipart path (aws-cli: 8 MiB threshold; rclone and s3cmd are configured to 5 MiB here).
TREE = {
    "top.txt": 1_000,
    "empty file.bin": 0,
    "big file.bin": 9 * MiB + 12_345,
    "dir one/nested file.txt": 2_048,
    "dir one/deeper/deepest/leaf.dat": 100_000,
    "dir one/deeper/sibling": 17,
    "dir two/a.txt": 1,
    "dir two/b c d.txt": 333,
}


FIXED_MTIME = 1_600_000_000  # 2020-09-13


def build_tree(root: Path) -> None:
    for rel, size in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(det_bytes("tree-" + rel, size))
        # A fixed mtime in the past: `aws s3 sync` must then see every object as up to date
        # (S3's LastModified has whole seconds, so a file written in the same second as its
        # upload could otherwise look newer than the object).
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))


def tree_digest(root: Path) -> dict:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def tool(name: str) -> str:
    """The venv's copy of a tool first (run.sh puts it on PATH), then the system's."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (tests/s3/run.sh installs it)")
    return found


def run(cmd, env, timeout=300) -> str:
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, f"{cmd!r} exited {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def base_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "RCLONE_", "S3CMD"))}
    env["HOME"] = str(home)
    env["LC_ALL"] = "C.UTF-8"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def remote_listing(s3, bucket, prefix):
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = o["Size"]
    return out


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    build_tree(root)
    return root


def test_aws_cli(s3, bucket, src, tmp_path):
    t = target()
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    config = home / ".aws" / "config"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = base_env(home)
    env.update(AWS_ACCESS_KEY_ID=t.access_key, AWS_SECRET_ACCESS_KEY=t.secret_key,
               AWS_DEFAULT_REGION=t.region, AWS_CONFIG_FILE=str(config),
               AWS_SHARED_CREDENTIALS_FILE=str(home / ".aws" / "credentials"),
               AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1")
    aws = [tool("aws"), "--endpoint-url", t.endpoint]
    quiet = ["--only-show-errors"]
    uri = f"s3://{bucket}/aws/"

    run(aws + ["s3", "cp", "--recursive", str(src), uri] + quiet, env)

    listed = {}
    for line in run(aws + ["s3", "ls", "--recursive", uri], env).splitlines():
        _date, _time, size, key = line.split(None, 3)
        assert key.startswith("aws/"), line
        listed[key[len("aws/"):]] = int(size)
    assert listed == TREE
    assert remote_listing(s3, bucket, "aws/") == TREE

    # Nothing to do for sync: sizes match and the objects are newer than the files.
    out = run(aws + ["s3", "sync", str(src), uri], env)
    assert "upload:" not in out, out

    dst = tmp_path / "out"
    dst.mkdir()
    run(aws + ["s3", "cp", "--recursive", uri, str(dst)] + quiet, env)
    assert tree_digest(dst) == tree_digest(src)

    # A copy inside the store: above the multipart threshold aws-cli copies with UploadPartCopy.
    copied = f"s3://{bucket}/aws-copy/big file.bin"
    run(aws + ["s3", "cp", uri + "big file.bin", copied] + quiet, env)
    got = s3.get_object(Bucket=bucket, Key="aws-copy/big file.bin")["Body"].read()
    assert got == (src / "big file.bin").read_bytes()
    run(aws + ["s3", "rm", copied] + quiet, env)

    run(aws + ["s3", "rm", "--recursive", uri] + quiet, env)
    assert remote_listing(s3, bucket, "aws/") == {}


def test_rclone(s3, bucket, src, tmp_path):
    t = target()
    home = tmp_path / "home"
    home.mkdir()
    conf = home / "rclone.conf"
    conf.write_text("")
    env = base_env(home)
    env.update({
        "RCLONE_CONFIG": str(conf),
        "RCLONE_CONFIG_BW_TYPE": "s3",
        "RCLONE_CONFIG_BW_PROVIDER": "Other",
        "RCLONE_CONFIG_BW_ENV_AUTH": "false",
        "RCLONE_CONFIG_BW_ACCESS_KEY_ID": t.access_key,
        "RCLONE_CONFIG_BW_SECRET_ACCESS_KEY": t.secret_key,
        "RCLONE_CONFIG_BW_REGION": t.region,
        "RCLONE_CONFIG_BW_ENDPOINT": t.endpoint,
        "RCLONE_CONFIG_BW_FORCE_PATH_STYLE": "true",
        "RCLONE_CONFIG_BW_UPLOAD_CUTOFF": "5M",
        "RCLONE_CONFIG_BW_CHUNK_SIZE": "5M",
    })
    if t.is_moto:
        # rclone HEADs an uploaded object with ?versionId=null when the server sent that version
        # id (moto does); moto then rejects its own "null" with a 400. Real S3 accepts it.
        env["RCLONE_CONFIG_BW_NO_HEAD"] = "true"
    rclone = [tool("rclone"), "--retries", "1", "--low-level-retries", "1", "--stats", "0"]
    remote = f"bw:{bucket}/rclone"

    run(rclone + ["copy", str(src), remote], env)

    listed = {}
    for line in run(rclone + ["ls", remote], env).splitlines():
        size, name = line.strip().split(" ", 1)
        listed[name] = int(size)
    assert listed == TREE
    assert remote_listing(s3, bucket, "rclone/") == TREE

    # rclone compares sizes and MD5s (from ETags, or its own metadata for multipart objects).
    run(rclone + ["check", str(src), remote], env)

    dst = tmp_path / "out"
    run(rclone + ["copy", remote, str(dst)], env)
    assert tree_digest(dst) == tree_digest(src)

    run(rclone + ["delete", remote], env)
    assert remote_listing(s3, bucket, "rclone/") == {}


def test_s3cmd(s3, bucket, src, tmp_path):
    t = target()
    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "s3cfg"
    cfg.write_text(
        "[default]\n"
        f"access_key = {t.access_key}\n"
        f"secret_key = {t.secret_key}\n"
        f"host_base = {t.netloc}\n"
        f"host_bucket = {t.netloc}\n"
        f"bucket_location = {t.region}\n"
        "use_https = False\n"
        "signature_v2 = False\n"
        "check_ssl_certificate = False\n"
        "multipart_chunk_size_mb = 5\n"
        "progress_meter = False\n"
    )
    env = base_env(home)
    s3cmd = [tool("s3cmd"), "-c", str(cfg), "--no-progress"]
    uri = f"s3://{bucket}/s3cmd/"

    run(s3cmd + ["put", "--recursive", str(src) + "/", uri], env)

    listed = {}
    for line in run(s3cmd + ["ls", "--recursive", uri], env).splitlines():
        _date, _time, size, obj = line.split(None, 3)
        assert obj.startswith(uri), line
        listed[obj[len(uri):]] = int(size)
    assert listed == TREE
    assert remote_listing(s3, bucket, "s3cmd/") == TREE

    dst = tmp_path / "out"
    dst.mkdir()
    run(s3cmd + ["get", "--recursive", uri, str(dst) + "/"], env)
    assert tree_digest(dst) == tree_digest(src)

    run(s3cmd + ["del", "--recursive", "--force", uri], env)
    assert remote_listing(s3, bucket, "s3cmd/") == {}

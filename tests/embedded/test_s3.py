"""The embedded S3 server: the part of S3 the broker's object-store client uses, with S3's answers."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from sp_dagster.embedded.s3 import EmbeddedS3


@pytest.fixture(scope="module")
def s3():
    with EmbeddedS3(bucket="b") as server:
        yield server


def call(s3, method, path, body=None, headers=None):
    """(status, headers, body) of one request."""
    url = f"{s3.endpoint}/b{'' if path.startswith('?') else '/'}{path}"  # a listing is the bucket's own URL
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_conditional_writes_create_once_and_update_only_the_version_read(s3):
    status, headers, _ = call(s3, "PUT", "w.json", b"1", {"If-None-Match": "*"})
    first = headers["ETag"]
    assert status == 200
    assert call(s3, "PUT", "w.json", b"x", {"If-None-Match": "*"})[0] == 412  # exists already
    status, headers, _ = call(s3, "PUT", "w.json", b"2", {"If-Match": first})
    assert status == 200 and headers["ETag"] != first
    assert call(s3, "PUT", "w.json", b"3", {"If-Match": first})[0] == 412  # a stale version
    assert call(s3, "PUT", "missing.json", b"3", {"If-Match": first})[0] == 404
    assert call(s3, "GET", "w.json")[2] == b"2"


def test_conditional_reads_answer_not_modified_only_for_the_current_version(s3):
    etag = call(s3, "PUT", "r.json", b"old")[1]["ETag"]
    assert call(s3, "GET", "r.json", headers={"If-None-Match": etag})[0] == 304
    call(s3, "PUT", "r.json", b"new")
    status, _headers, body = call(s3, "GET", "r.json", headers={"If-None-Match": etag})
    assert (status, body) == (200, b"new")
    assert call(s3, "GET", "r.json", headers={"If-Match": etag})[0] == 412
    status, headers, body = call(s3, "GET", "r.json", headers={"Range": "bytes=1-2"})
    assert (status, body, headers["Content-Range"]) == (206, b"ew", "bytes 1-2/3")
    assert call(s3, "GET", "nothing-here")[0] == 404


def test_listing_pages_groups_by_delimiter_and_orders_writes_in_time(s3):
    for n in range(5):
        call(s3, "PUT", f"list/p/{n:02d}.batch", b"x")
    call(s3, "PUT", "list/q/00.batch", b"x")
    _status, _headers, body = call(s3, "GET", "?list-type=2&prefix=list/&delimiter=/")
    assert re.findall(rb"<Prefix>(list/[pq]/)</Prefix>", body) == [b"list/p/", b"list/q/"]
    keys, token = [], ""
    while True:
        _status, _headers, body = call(s3, "GET", f"?list-type=2&prefix=list/p/&max-keys=2{token}")
        keys += re.findall(rb"<Key>([^<]+)</Key>", body)
        found = re.search(rb"<NextContinuationToken>([^<]+)</NextContinuationToken>", body)
        if not found:
            break
        token = f"&continuation-token={found.group(1).decode()}"
    assert keys == [f"list/p/{n:02d}.batch".encode() for n in range(5)]
    _status, _headers, body = call(s3, "GET", "?list-type=2&prefix=list/p/")
    times = re.findall(rb"<LastModified>([^<]+)</LastModified>", body)
    assert times == sorted(times) and len(set(times)) == len(times)  # distinct and in write order
    assert call(s3, "DELETE", "list/q/00.batch")[0] == 204
    assert b"list/q/" not in call(s3, "GET", "?list-type=2&prefix=list/")[2]

"""An S3 server for the embedded broker's durable storage in tests and benches.
The shipped tansu binary keeps its data in memory or in S3; on this server a broker killed and started
again keeps its data for as long as the server runs (objects are held in memory). Why not moto: see
"Broker restart on durable storage" in docs/operations/failover.md.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from xml.sax.saxutils import escape

from sp_dagster.embedded.broker import EmbeddedBroker, EmbeddedServer

REGION = "eu-west-2"
PAGE = 1000  # keys per ListObjectsV2 page, as S3's default


@dataclass(frozen=True)
class StoredObject:
    body: bytes
    etag: str
    modified_ns: int  # strictly increasing across the store (see ObjectStore.written)
    content_type: str

    def headers(self) -> dict[str, str]:
        return {
            "ETag": self.etag,
            "Last-Modified": formatdate(self.modified_ns / 1e9, usegmt=True),
            "Content-Type": self.content_type,
            "Accept-Ranges": "bytes",
        }

    def listed_modified(self) -> str:
        """LastModified as a listing gives it, to the nanosecond (S3 gives milliseconds of whole seconds)."""
        seconds, ns = divmod(self.modified_ns, 1_000_000_000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns:09d}Z"


def _error(status: int, code: str, message: str):
    from aiohttp import web

    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    return web.Response(status=status, text=body, content_type="application/xml")


class ObjectStore:
    """Buckets of objects in memory, served over HTTP with S3's semantics.

    It serves the part of the S3 API the broker's object-store client uses: PUT (conditional on
    `If-Match` / `If-None-Match: *`), GET and HEAD (conditional on `If-None-Match` / `If-Match`, ranges),
    DELETE, ListObjectsV2 (prefix, delimiter, continuation) and bucket creation. Requests are not
    authenticated.
    """

    def __init__(self):
        self.buckets: dict[str, dict[str, StoredObject]] = {}
        self._last_ns = 0

    def written(self) -> int:
        """A write's time in ns, later than every earlier write's.

        tansu 0.6 finds a partition's latest offset as the newest record object by LastModified;
        with S3's whole-second times, batches written within one second tie and it answers an
        older offset. Distinct, ordered times keep its answer right, as its in-memory store does.
        """
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def app(self):
        """The aiohttp application."""
        from aiohttp import web

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{bucket}", self.bucket)
        app.router.add_route("*", "/{bucket}/{key:.+}", self.object)
        app.router.add_route("GET", "/", self.root)
        return app

    async def root(self, _request):
        from aiohttp import web

        return web.Response(text="sp-dagster embedded S3")

    async def bucket(self, request):
        from aiohttp import web

        name = request.match_info["bucket"]
        if request.method == "PUT":
            self.buckets.setdefault(name, {})
            return web.Response(status=200)
        if name not in self.buckets:
            return _error(404, "NoSuchBucket", name)
        if request.method == "HEAD":
            return web.Response(status=200)
        if request.method == "GET":
            return self._list(self.buckets[name], name, request.query)
        if request.method == "POST" and "delete" in request.query:
            return await self._delete_many(self.buckets[name], await request.text())
        return _error(405, "MethodNotAllowed", request.method)

    def _list(self, objects: dict[str, StoredObject], name: str, query):
        from aiohttp import web

        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        after = query.get("continuation-token") or query.get("start-after", "")
        limit = min(int(query.get("max-keys", PAGE)), PAGE)
        contents, prefixes, truncated, last = [], [], False, ""
        for key in sorted(k for k in objects if k.startswith(prefix) and k > after):
            if len(contents) + len(prefixes) == limit:
                truncated = True
                break
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if not prefixes or prefixes[-1] != common:
                    prefixes.append(common)
                last = key
                continue
            contents.append(key)
            last = key
        parts = [f"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>{escape(name)}</Name><Prefix>{escape(prefix)}</Prefix>"]
        parts.append(f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{limit}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>")
        if truncated:
            parts.append(f"<NextContinuationToken>{escape(last)}</NextContinuationToken>")
        for key in contents:
            item = objects[key]
            parts.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{item.listed_modified()}</LastModified><ETag>{escape(item.etag)}</ETag><Size>{len(item.body)}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            )
        parts += [f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes]
        parts.append("</ListBucketResult>")
        return web.Response(text="".join(parts), content_type="application/xml")

    async def _delete_many(self, objects: dict[str, StoredObject], body: str):
        import xml.etree.ElementTree as ET

        from aiohttp import web

        keys = [element.text or "" for element in ET.fromstring(body).iter() if element.tag.endswith("Key")]
        for key in keys:
            objects.pop(key, None)
        deleted = "".join(f"<Deleted><Key>{escape(key)}</Key></Deleted>" for key in keys)
        return web.Response(text=f"<?xml version='1.0' encoding='UTF-8'?><DeleteResult>{deleted}</DeleteResult>", content_type="application/xml")

    async def object(self, request):
        from aiohttp import web

        bucket, key = request.match_info["bucket"], request.match_info["key"]
        objects = self.buckets.get(bucket)
        if objects is None:
            return _error(404, "NoSuchBucket", bucket)
        current = objects.get(key)
        if request.method == "PUT":
            body = await request.read()  # read before the check: no await between the check and the write
            if "x-amz-copy-source" in request.headers:
                return _error(501, "NotImplemented", "copying objects")
            if failed := self._precondition_for_write(request.headers, objects.get(key)):
                return failed
            stored = StoredObject(body, f'"{hashlib.md5(body).hexdigest()}"', self.written(), request.headers.get("Content-Type", "binary/octet-stream"))
            objects[key] = stored
            return web.Response(status=200, headers={"ETag": stored.etag})
        if request.method == "DELETE":
            objects.pop(key, None)
            return web.Response(status=204)
        if request.method not in ("GET", "HEAD"):
            return _error(405, "MethodNotAllowed", request.method)
        if current is None:
            return _error(404, "NoSuchKey", key)
        if (match := request.headers.get("If-Match")) and match not in ("*", current.etag):
            return _error(412, "PreconditionFailed", "If-Match")
        if (none_match := request.headers.get("If-None-Match")) and none_match in ("*", current.etag):
            return web.Response(status=304, headers={"ETag": current.etag})
        if request.method == "HEAD":
            return web.Response(status=200, headers={**current.headers(), "Content-Length": str(len(current.body))})
        return self._ranged(current, request.http_range)

    @staticmethod
    def _precondition_for_write(headers, current: StoredObject | None):
        match, none_match = headers.get("If-Match"), headers.get("If-None-Match")
        if none_match == "*" and current is not None:
            return _error(412, "PreconditionFailed", "the object exists (If-None-Match: *)")
        if match and current is None:
            return _error(404, "NoSuchKey", "the object does not exist (If-Match)")
        if match and match not in ("*", current.etag):  # pyright: ignore[reportOptionalMemberAccess]
            return _error(412, "PreconditionFailed", "the object changed (If-Match)")
        return None

    @staticmethod
    def _ranged(current: StoredObject, wanted: slice):
        from aiohttp import web

        size = len(current.body)
        if wanted.start is None and wanted.stop is None:
            return web.Response(body=current.body, headers=current.headers())
        start, stop = (wanted.start or 0), (wanted.stop if wanted.stop is not None else size)
        if start < 0:
            start, stop = max(size + start, 0), size
        stop = min(stop, size)
        if start >= size:
            return _error(416, "InvalidRange", f"bytes {start}- of {size}")
        headers = {**current.headers(), "Content-Range": f"bytes {start}-{stop - 1}/{size}"}
        return web.Response(status=206, body=current.body[start:stop], headers=headers)


class EmbeddedS3(EmbeddedServer):
    """Our S3 server (ObjectStore) in a process of its own, with one bucket made at start.

    A broker that keeps its data there:

        with EmbeddedS3() as s3, s3.broker() as broker:
            ...
    """

    what = "S3 server"

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", bucket: str = "tansu", log_path: str | Path | None = None):
        super().__init__(port, host, log_path)
        self.bucket = bucket

    @property
    def endpoint(self) -> str:
        """The server's URL."""
        return f"http://{self.host}:{self.port}"

    @property
    def storage(self) -> str:
        """The broker's --storage-engine for this server's bucket."""
        return f"s3://{self.bucket}/"

    def client_environment(self) -> dict[str, str]:
        """What an S3 client (the broker) needs to find and use this server."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "sp-dagster",
            "AWS_SECRET_ACCESS_KEY": "sp-dagster",
        }

    def broker(self, **options) -> EmbeddedBroker:
        """An embedded broker (not started) that keeps its data in this server's bucket."""
        return EmbeddedBroker(storage=self.storage, environment=self.client_environment(), **options)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sp_dagster.embedded.s3", "--host", self.host, "--port", str(self.port)]

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=2).close()
            return True
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 30.0):
        """Start the server and make the bucket."""
        super().start(timeout)
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT"), timeout=10).close()
        return self


def main() -> None:
    """Serve an in-memory S3 on --host:--port until killed."""
    from aiohttp import web

    parser = argparse.ArgumentParser(description="An in-memory S3 server for the embedded broker's storage.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(ObjectStore().app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

"""An HTTP proxy that makes kinesis-local's SubscribeToShard behave as AWS's does, for tests and benchmarks.

kinesis-local (kinesis-mock 0.6.2) is the one local emulator that serves enhanced fan-out, but its subscriptions
differ from AWS's in ways that matter to a client (docs/testing.md has the whole list):

* it sends no ``initial-response`` event first, and botocore refuses a stream without one;
* it reports a request-level error (a second subscriber's ``ResourceInUseException``, an unknown consumer's
  ``ResourceNotFoundException``) as HTTP 200 with one exception event, where AWS answers HTTP 400;
* a subscription to a shard that was split or merged never ends: it pushes empty events, never ``ChildShards``;
* a subscription lasts 5 minutes, hard-coded.

:class:`FanOutProxy` sits between the client and kinesis-local and fixes exactly these, leaving every other request
and every event as they are: it adds the ``initial-response`` event, turns a first exception event into AWS's
HTTP 400 error, ends a subscription to a closed shard with AWS's last event (no continuation, the ``ChildShards``
from ListShards) once it has delivered everything, and ends every subscription after ``subscription_s`` (AWS's 5
minutes by default; shorter to test renewals)::

    with start_kinesis_local() as emulator, FanOutProxy(emulator.endpoint_url, subscription_s=10) as proxy:
        kinesis = aws.client("kinesis", AwsConfig(endpoint_url=proxy.endpoint_url))

Production code accepts nothing here that AWS would not send.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

_PRELUDE = 12  # total length, headers length, prelude CRC
_STRING = 7  # the event-stream header type of a string


def encode_event(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message (AWS's binary framing, string headers only)."""
    encoded = b"".join(
        bytes([len(name)]) + name.encode() + bytes([_STRING]) + struct.pack(">H", len(value.encode())) + value.encode()
        for name, value in headers
    )
    prelude = struct.pack(">II", _PRELUDE + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _event(event_type: str, body: dict[str, Any]) -> bytes:
    headers = [(":message-type", "event"), (":event-type", event_type), (":content-type", "application/json")]
    return encode_event(headers, json.dumps(body).encode())


INITIAL_RESPONSE = _event("initial-response", {})


def _headers(raw: bytes) -> dict[str, str]:
    found: dict[str, str] = {}
    at = 0
    while at < len(raw):
        size = raw[at]
        name = raw[at + 1 : at + 1 + size].decode()
        at += 1 + size
        if raw[at] != _STRING:
            break  # kinesis-local sends string headers only
        length = struct.unpack(">H", raw[at + 1 : at + 3])[0]
        found[name] = raw[at + 3 : at + 3 + length].decode()
        at += 3 + length
    return found


class _Frame:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        headers_length = struct.unpack(">I", raw[4:8])[0]
        self.headers = _headers(raw[_PRELUDE : _PRELUDE + headers_length])
        self.payload = raw[_PRELUDE + headers_length : -4]


def _read_frame(response: http.client.HTTPResponse) -> _Frame | None:
    prelude = _read_exact(response, _PRELUDE)
    if len(prelude) < _PRELUDE:
        return None
    rest = _read_exact(response, struct.unpack(">I", prelude[:4])[0] - _PRELUDE)
    return _Frame(prelude + rest)


def _read_exact(response: http.client.HTTPResponse, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = response.read(size - len(data))
        if not part:
            break
        data += part
    return data


class FanOutProxy:
    """A proxy to ``upstream`` (kinesis-local) on a free loopback port, serving in threads of its own until
    :meth:`stop` (or the end of the ``with`` block). ``subscription_s``: when subscriptions end (AWS: 5 min)."""

    def __init__(self, upstream: str, *, subscription_s: float = 300.0) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.subscription_s = subscription_s
        self.subscriptions = 0  # SubscribeToShard calls relayed
        self._lock = threading.Lock()
        self._shards: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fanout-proxy", daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FanOutProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FanOutProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def upstream(self, timeout_s: float = 330.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=timeout_s)

    def shard_state(self, request_headers: dict[str, str], stream: str, shard_id: str) -> tuple[bool, list[Any]]:
        """Whether ``shard_id`` is closed, and its children as AWS's ``ChildShards`` (ListShards upstream, at most
        once a second per stream: every subscription asks at every empty event)."""
        with self._lock:
            cached = self._shards.get(stream)
        if cached is not None and time.monotonic() - cached[0] < 1.0:
            shards = cached[1]
        else:
            shards = self._list_shards(request_headers, stream)
            with self._lock:
                self._shards[stream] = (time.monotonic(), shards)
        this = next((s for s in shards if s["ShardId"] == shard_id), None)
        closed = this is not None and bool(this.get("SequenceNumberRange", {}).get("EndingSequenceNumber"))
        children = [
            {
                "ShardId": s["ShardId"],
                "ParentShards": [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p],
                "HashKeyRange": s["HashKeyRange"],
            }
            for s in shards
            if shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))
        ]
        return closed, children

    def _list_shards(self, request_headers: dict[str, str], stream: str) -> list[dict[str, Any]]:
        shards: list[dict[str, Any]] = []
        body: dict[str, Any] = {"StreamName": stream}
        while True:
            connection = self.upstream(10.0)
            try:
                headers = {**request_headers, "X-Amz-Target": "Kinesis_20131202.ListShards"}
                connection.request("POST", "/", json.dumps(body), headers)
                reply = json.loads(connection.getresponse().read() or b"{}")
            finally:
                connection.close()
            shards += reply.get("Shards", [])
            if not reply.get("NextToken"):
                break
            body = {"NextToken": reply["NextToken"]}
        return shards


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FanOutProxy

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fanout proxy: " + format, *args)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {name: value for name, value in self.headers.items() if name.lower() != "content-length"}
        upstream = self.owner.upstream()
        try:
            upstream.request("POST", self.path, body, headers)
            response = upstream.getresponse()
            subscribe = self.headers.get("X-Amz-Target", "").endswith(".SubscribeToShard")
            if subscribe and response.status == 200:
                self.owner.subscriptions += 1
                self._close_upstream_when_the_client_leaves(upstream)
                self._subscription(response, json.loads(body or b"{}"), headers)
            else:
                self._relay(response)
        except (OSError, http.client.HTTPException):
            pass  # the client went away (or was killed); closing upstream ends kinesis-local's subscription
        finally:
            upstream.close()

    def _close_upstream_when_the_client_leaves(self, upstream: http.client.HTTPConnection) -> None:
        """AWS notices a subscriber that closed its connection at once; the relay alone would notice only at its
        next write (kinesis-local's next tick): watch the client's socket and close the upstream one then. The
        watch only peeks: once a subscription ended, the client may send its next request on the same
        connection, and that belongs to the handler."""
        client = self.connection

        def watch() -> None:
            with contextlib.suppress(OSError):
                if client.recv(1, socket.MSG_PEEK):
                    return  # a next request (after the subscription ended): not a close
            with contextlib.suppress(OSError, AttributeError):
                upstream.sock.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=watch, name="fanout-proxy-watch", daemon=True).start()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        data = response.read()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _subscription(
        self, response: http.client.HTTPResponse, request: dict[str, Any], headers: dict[str, str]
    ) -> None:
        first = _read_frame(response)
        if first is not None and first.headers.get(":message-type") == "exception":
            self._error(first)  # AWS: a request-level error is HTTP 400, botocore raises ClientError
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(INITIAL_RESPONSE)
        stream = str(request.get("ConsumerARN", "")).split(":stream/", 1)[-1].split("/consumer/", 1)[0]
        shard_id = str(request.get("ShardId", ""))
        ends_at = time.monotonic() + self.owner.subscription_s
        frame = first
        while frame is not None:
            if frame.headers.get(":event-type") == "SubscribeToShardEvent" and self._at_end_of_closed_shard(
                frame, headers, stream, shard_id
            ):
                break
            self._chunk(frame.raw)
            if time.monotonic() >= ends_at:
                break  # AWS ends every subscription after 5 minutes
            frame = _read_frame(response)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _at_end_of_closed_shard(self, frame: _Frame, headers: dict[str, str], stream: str, shard_id: str) -> bool:
        """For an empty event of a closed shard (everything delivered): send AWS's last event instead; True then."""
        if len(frame.payload) > 1024:
            return False  # records in it: not the end (and not worth parsing to find out)
        event = json.loads(frame.payload or b"{}")
        if event.get("Records") or event.get("ChildShards"):
            return False
        with contextlib.suppress(OSError, ValueError, KeyError):
            closed, children = self.owner.shard_state(headers, stream, shard_id)
            if closed:
                last = {
                    "Records": [],
                    "ContinuationSequenceNumber": None,
                    "MillisBehindLatest": 0,
                    "ChildShards": children,
                }
                self._chunk(_event("SubscribeToShardEvent", last))
                return True
        return False

    def _error(self, frame: _Frame) -> None:
        code = frame.headers.get(":exception-type", "InternalFailureException")
        message = json.loads(frame.payload or b"{}").get("message", "")
        data = json.dumps({"__type": code, "message": message}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("x-amzn-ErrorType", code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

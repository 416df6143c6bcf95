"""A small etcd v3 client for Trio, over etcd's documented JSON gateway.

Design note. The group needs seven things of etcd: grant a lease, keep it
alive, revoke it, read keys (one or a prefix), create a key only if it does
not exist (a transaction on ``create_revision == 0``), delete one, and learn at
once that one was deleted (a watch: the target of a planned move waits so for
the owner to let the pair go, docs/group.md). The
maintained Python clients speak gRPC on asyncio or threads; the gateway
(``POST /v3/kv/range`` and friends, base64 keys and values, JSON bodies) is a
stable, documented part of etcd since 3.3, so the client is h11 (sans-I/O
HTTP/1.1, as our codec is sans-I/O msgpack) over a Trio TCP stream.

One connection per call: the calls are few (a keep-alive every third of the
lease, a poll of the owner keys every few hundred milliseconds), a loopback
connection costs well under a millisecond, and a fresh connection can never
be a half-dead one left over from a partition (a watch is held for a bounded
time, then the key is read again: a lost stream costs one read, never a
missed delete). Every call has a deadline; an
endpoint that does not answer by it is skipped for the next, and when none
answers the call raises ``EtcdUnavailable`` naming what was tried, which is
what the node's lease logic acts on (docs/group.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["KV", "Etcd", "EtcdError", "EtcdUnavailable"]

CALL_TIMEOUT = 1.0  # seconds one endpoint may take for a call; a fifth of the default lease
MAX_RESPONSE = 16 << 20  # bytes: far above any range of a group's keys


class EtcdError(Exception):
    """etcd answered, but with an error (the message is etcd's)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time: etcd is down or out of reach."""


@dataclass(frozen=True)
class KV:
    """One key as etcd holds it; ``create_revision`` of an owner key is its epoch."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    def json(self) -> Any:
        return json.loads(self.value)


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    """The range end that selects every key starting with ``prefix`` (etcd's rule)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return _b64(bytes(raw))


def _kv(item: dict[str, Any]) -> KV:
    return KV(key=base64.b64decode(item["key"]).decode(),
              value=base64.b64decode(item.get("value", "")),
              create_revision=int(item.get("create_revision", 0)),
              mod_revision=int(item.get("mod_revision", 0)),
              lease=int(item.get("lease", 0)))


class Etcd:
    """The group's view of one etcd cluster, given as ``http://host:port`` endpoints."""

    def __init__(self, endpoints: list[str] | tuple[str, ...],
                 timeout: float = CALL_TIMEOUT) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._next = 0  # the endpoint that answered last is tried first

    # -- leases ---------------------------------------------------------------

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted)."""
        reply = await self.call("/v3/lease/grant", {"TTL": ttl})
        return int(reply["ID"]), int(reply["TTL"])

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease``; the TTL it now has, 0 if it has expired (or never was)."""
        reply = await self.call("/v3/lease/keepalive", {"ID": lease})
        return int(reply.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now: the keys bound to it go at once."""
        try:
            await self.call("/v3/lease/revoke", {"ID": lease})
        except EtcdError as err:
            if "not found" not in str(err):
                raise

    # -- keys -----------------------------------------------------------------

    async def get(self, key: str) -> KV | None:
        reply = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = reply.get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        """Every key under ``prefix`` and the store's revision they were read at."""
        reply = await self.call("/v3/kv/range",
                                {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return [_kv(i) for i in reply.get("kvs", [])], int(reply["header"]["revision"])

    async def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        """Set ``key``; the revision of the write."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        reply = await self.call("/v3/kv/put", body)
        return int(reply["header"]["revision"])

    async def create(self, key: str, value: bytes | str, lease: int = 0) -> tuple[bool, KV | None]:
        """Set ``key`` only if it does not exist: (whether it was set, the key as it is now)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = lease
        reply = await self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(key)}}],
        })
        succeeded = bool(reply.get("succeeded", False))
        if succeeded:
            revision = int(reply["header"]["revision"])
            raw = value.encode() if isinstance(value, str) else value
            return True, KV(key, raw, revision, revision, lease)
        ranged = reply["responses"][0]["response_range"].get("kvs", [])
        return False, _kv(ranged[0]) if ranged else None

    async def put_if(self, key: str, value: bytes | str, create_revision: int,
                     lease: int) -> bool:
        """Set ``key`` if it is still the one created at ``create_revision`` (an owner
        rewrites only its own ownership: gone, it must not make it again)."""
        reply = await self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(create_revision)}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value),
                                         "lease": lease}}],
        })
        return bool(reply.get("succeeded", False))

    async def delete_if(self, key: str, create_revision: int,
                        put: dict[str, str] | None = None) -> bool:
        """Delete ``key`` if it is still the one created at ``create_revision``
        (an owner gives up only its own ownership, never a successor's), and set the
        keys of ``put`` in the same transaction."""
        success: list[dict[str, Any]] = [{"request_delete_range": {"key": _b64(key)}}]
        success += [{"request_put": {"key": _b64(k), "value": _b64(v)}}
                    for k, v in (put or {}).items()]
        reply = await self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(create_revision)}],
            "success": success,
        })
        return bool(reply.get("succeeded", False))

    async def delete_if_value(self, key: str, value: str) -> bool:
        """Delete ``key`` if it still holds ``value`` (a request not replaced since)."""
        reply = await self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "VALUE", "result": "EQUAL",
                         "value": _b64(value)}],
            "success": [{"request_delete_range": {"key": _b64(key)}}],
        })
        return bool(reply.get("succeeded", False))

    async def delete(self, key: str) -> None:
        await self.call("/v3/kv/deleterange", {"key": _b64(key)})

    async def delete_keys(self, keys: list[str]) -> None:
        """Delete every key of ``keys`` in one transaction."""
        await self.call("/v3/kv/txn", {"success": [
            {"request_delete_range": {"key": _b64(k)}} for k in keys]})

    async def deleted(self, key: str, after: int) -> bool:
        """Wait for ``key`` to be deleted after revision ``after`` (a watch from the next
        revision, so a delete before the call counts): True once it is, False if the
        stream ended first. The caller bounds the wait. Raises EtcdError if the watch
        cannot be made (history compacted, etcd out of reach): the caller reads the key
        instead, as it would without a watch."""
        body = {"create_request": {"key": _b64(key), "start_revision": str(after + 1)}}
        lines = _Lines()
        endpoint = self.endpoints[self._next]
        try:
            await _exchange(endpoint, "/v3/watch", body, lines.feed)
        except (OSError, h11.ProtocolError, ValueError) as err:
            raise EtcdUnavailable(f"etcd watch at {endpoint}: {err}") from err
        if lines.error is not None:
            raise EtcdError(f"etcd watch of {key}: {lines.error}")
        return lines.deleted

    # -- transport ------------------------------------------------------------

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to each endpoint in turn until one answers; its JSON reply."""
        tried = []
        for i in range(len(self.endpoints)):
            n = (self._next + i) % len(self.endpoints)
            endpoint = self.endpoints[n]
            with trio.move_on_after(self.timeout):
                try:
                    reply = await _post(endpoint, path, body)
                except (OSError, h11.ProtocolError, ValueError) as err:
                    tried.append(f"{endpoint}: {err}")
                    continue
                self._next = n
                error = reply.get("error")
                if isinstance(error, dict):  # an error inside a stream's result
                    error = error.get("message", error)
                if error and "header" not in reply and "header" not in reply.get("result", {}):
                    raise EtcdError(f"etcd {path}: {error}")
                return reply
            tried.append(f"{endpoint}: no answer in {self.timeout:g} s")
        raise EtcdUnavailable("etcd unreachable (" + "; ".join(tried) + ")")


class _Lines:
    """A watch's reply: one JSON message a line, read until one reports a delete."""

    def __init__(self) -> None:
        self.buffer = b""
        self.deleted = False
        self.error: str | None = None

    def feed(self, data: bytes) -> bool:
        """Take a piece of the stream; True once the watch has its answer."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in filter(None, map(bytes.strip, lines)):
            message = json.loads(line)
            result = message.get("result", {})
            if "error" in message or result.get("canceled"):
                self.error = str(message.get("error") or result.get("cancel_reason")
                                 or "watch canceled")
                return True
            if any(e.get("type") == "DELETE" for e in result.get("events", ())):
                self.deleted = True
                return True
        if len(self.buffer) > MAX_RESPONSE:  # no line end in sight: not a watch's reply
            self.error = f"a reply line over {MAX_RESPONSE} bytes"
            return True
        return False


async def _post(endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    chunks: list[bytes] = []

    def take(data: bytes) -> bool:
        chunks.append(data)
        if sum(map(len, chunks)) > MAX_RESPONSE:
            raise ValueError(f"etcd {path}: reply over {MAX_RESPONSE} bytes")
        return False

    status = await _exchange(endpoint, path, body, take)
    text = b"".join(chunks)
    try:
        reply = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"etcd {path}: HTTP {status}, not JSON: {text[:200]!r}") from None
    if status >= 500 and "error" not in reply:
        raise ValueError(f"etcd {path}: HTTP {status}")
    return reply  # type: ignore[no-any-return]


async def _exchange(endpoint: str, path: str, body: dict[str, Any],
                    take: Callable[[bytes], bool]) -> int:
    """POST ``body`` and hand each piece of the reply's body to ``take`` as it arrives,
    until the body ends or ``take`` returns True; the HTTP status."""
    url = urlsplit(endpoint)
    if url.scheme != "http" or not url.hostname or not url.port:
        raise ValueError(f"not an http://HOST:PORT endpoint: {endpoint}")
    payload = json.dumps(body).encode()
    conn = h11.Connection(h11.CLIENT)
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    async with stream:
        request = h11.Request(method="POST", target=path, headers=[
            ("Host", url.netloc), ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))), ("Connection", "close")])
        await stream.send_all(conn.send(request) + conn.send(h11.Data(data=payload))
                              + conn.send(h11.EndOfMessage()))
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                if take(bytes(event.data)):
                    return status
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status

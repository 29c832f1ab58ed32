"""Talking to a running server over HTTP (`capdiag probe URL`): GET with a timeout, TLS,
extra headers and a bearer token from an environment variable; every failure one line.

A 404 means the endpoint is not in this version: `get` then tries the next path it was given
(SGLang's `/server_info` before `/get_server_info`, `/v1/loads` before `/get_load`).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import httpx

from capdiag.errors import InputError
from capdiag.frozen import frozen

MAX_BODY = 64 << 20  # bytes read of one response


@frozen
class Response:
    path: str  # the path that answered
    status: int
    text: str

    def json(self) -> Any:
        try:
            return json.loads(self.text)
        except ValueError:
            raise InputError(f"GET {self.path}: the answer is not JSON ({self.text[:60]!r}…)") from None


class Server:
    """One server's base URL and how to reach it."""

    def __init__(self, url: str, *, timeout: float = 10.0, headers: tuple[str, ...] = (),
                 token: Optional[str] = None, verify: bool | str = True):
        if not url.startswith(("http://", "https://")):
            raise InputError(f"{url}: a server URL starts with http:// or https://")
        self.url = url.rstrip("/")
        sent = {}
        for header in headers:
            name, sep, value = header.partition(":")
            if not sep or not name.strip():
                raise InputError(f"--header {header!r}: write it as 'Name: value'")
            sent[name.strip()] = value.strip()
        if token:
            sent.setdefault("Authorization", f"Bearer {token}")
        self.client = httpx.Client(timeout=timeout, headers=sent, verify=verify, follow_redirects=True)

    def close(self) -> None:
        self.client.close()

    def get(self, *paths: str, required: bool = True) -> Optional[Response]:
        """The first of `paths` that answers 200; None when all are missing (404) and not required."""
        missing = []
        for path in paths:
            try:
                with self.client.stream("GET", self.url + path) as reply:
                    body = reply.read()[:MAX_BODY] if reply.status_code == 200 else b""
            except httpx.ConnectError as exc:
                raise InputError(f"{self.url}: cannot connect ({_reason(exc)})") from None
            except httpx.TimeoutException:
                raise InputError(f"GET {self.url}{path}: no answer within {self.client.timeout.read} s") from None
            except httpx.HTTPError as exc:
                raise InputError(f"GET {self.url}{path}: {_reason(exc)}") from None
            if reply.status_code == 200:
                return Response(path, 200, body.decode("utf-8", "replace"))
            if reply.status_code in (404, 405):
                missing.append(path)
                continue
            if reply.status_code in (401, 403):
                raise InputError(f"GET {self.url}{path}: {reply.status_code} — the server wants credentials "
                                 "(--header or --token-env)")
            raise InputError(f"GET {self.url}{path}: HTTP {reply.status_code}")
        if required:
            raise InputError(f"{self.url}: none of {', '.join(missing)} answers (404): not this framework or version")
        return None


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:160]

"""Talking to a running server over HTTP (`capdiag probe URL`): GET with a timeout, TLS,
extra headers and a bearer token from an environment variable; every failure one line.

A 404 means the endpoint is not in this version: `get` then tries the next path it was given
(SGLang's `/server_info` before `/get_server_info`, `/v1/loads` before `/get_load`).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Optional

import httpx

from capdiag.errors import InputError
from capdiag.frozen import frozen
from capdiag.side_input import json_problem

MAX_BODY = 64 << 20  # bytes read of one response


@frozen
class Response:
    path: str  # the path that answered
    status: int
    text: str

    def json(self) -> Any:
        """The answer as JSON, held to what any JSON input is (capdiag.side_input): nested at most
        MAX_DEPTH deep, every number finite."""
        try:
            data = json.loads(self.text)
        except (ValueError, RecursionError):  # not JSON, a 5,000-digit number, nested past Python's stack
            raise InputError(f"GET {self.path}: the answer is not JSON ({self.text[:60]!r}…)") from None
        problem = json_problem(data)
        if problem is not None:
            raise InputError(f"GET {self.path}: the answer {problem}")
        return data


class Server:
    """One server's base URL and how to reach it. Credentials in the URL (`http://user:pw@host`)
    are sent as Basic auth and never shown: `url`, which every message and report names, is
    without them.
    The headers given (and the token) go to the server's own origin only, not to where a redirect
    points; each request ends within `timeout` seconds in all, however slowly the server sends."""

    def __init__(self, url: str, *, timeout: float = 10.0, headers: tuple[str, ...] = (),
                 token: Optional[str] = None, verify: bool | str = True):
        if not url.startswith(("http://", "https://")):
            raise InputError(f"{public_url(url)}: a server URL starts with http:// or https://")
        try:
            parsed = httpx.URL(url.rstrip("/"))
            if not parsed.host:
                raise httpx.InvalidURL("no host")
        except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
            # the parser's reason quotes the piece it choked on, which may be the password's
            said = "its parser's reason is not shown: it may quote the credentials" if _USERINFO.search(url) \
                else _reason(exc)
            raise InputError(f"{public_url(url)}: not a valid URL ({said})") from None
        auth = (parsed.username, parsed.password) if parsed.username or parsed.password else None
        self.url = str(parsed.copy_with(username=None, password=None))
        self.timeout = timeout
        sent = {}
        for header in headers:
            name, sep, value = header.partition(":")
            if not sep or not name.strip():
                raise InputError("--header: write it as 'Name: value' (the text given is not shown: it may hold a secret)")
            if not _printable(name.strip()) or not _printable(value.strip()):
                raise InputError(f"--header {name.strip()[:40]!r}: a header holds printable ASCII only "
                                 "(its value is not shown)" if _printable(name.strip()) else
                                 "--header: a header holds printable ASCII only (not shown)")
            sent[name.strip()] = value.strip()
        if token:
            if not _printable(token):
                raise InputError("the token holds a control or non-ASCII character (a line end?): it is not shown")
            sent.setdefault("Authorization", f"Bearer {token}")
        self._origin = (parsed.scheme, parsed.host, parsed.port)
        self.asked: list[tuple[str, int]] = []  # (path, HTTP status) of every request, in order
        self._given = tuple(sent)
        self.client = httpx.Client(timeout=timeout, headers=sent, auth=auth, verify=verify, follow_redirects=True,
                                   event_hooks={"request": [self._own_origin_only]})

    def _own_origin_only(self, request: httpx.Request) -> None:
        """A redirect to another origin gets none of the headers given (nor Basic auth)."""
        if (request.url.scheme, request.url.host, request.url.port) != self._origin:
            for name in self._given + ("Authorization",):
                request.headers.pop(name, None)

    def close(self) -> None:
        self.client.close()

    def _read(self, reply: httpx.Response, path: str) -> bytes:
        """The body, at most MAX_BODY bytes, decoded as sent (gzip) and read by the chunk: an endless
        or a bombed body stops at the bound, a slow one at the deadline."""
        body = bytearray()
        deadline = time.monotonic() + self.timeout
        for chunk in reply.iter_bytes():
            body += chunk[:MAX_BODY - len(body)]
            if len(body) >= MAX_BODY:
                break
            if time.monotonic() > deadline:
                raise InputError(f"GET {self.url}{path}: the answer did not end within {self.timeout:g} s")
        return bytes(body)

    def get(self, *paths: str, required: bool = True) -> Optional[Response]:
        """The first of `paths` that answers 200; None when all are missing (404) and not required."""
        missing = []
        for path in paths:
            try:
                with self.client.stream("GET", self.url + path) as reply:
                    body = self._read(reply, path) if reply.status_code == 200 else b""
            except httpx.ConnectError as exc:
                raise InputError(f"{self.url}: cannot connect ({_reason(exc)})") from None
            except httpx.TimeoutException:
                raise InputError(f"GET {self.url}{path}: no answer within {self.timeout:g} s") from None
            except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
                raise InputError(f"GET {self.url}{path}: {_reason(exc)}") from None
            self.asked.append((path, reply.status_code))
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


def _printable(text: str) -> bool:
    return all(" " <= ch <= "~" or ch == "\t" for ch in text)


# the credentials of a URL: all before its last `@` ahead of any query or fragment — a password
# may hold `/` or a space a user did not percent-encode, so the authority's own end is no bound
# (a path's `@` hides the host as well, which errs on the safe side)
_USERINFO = re.compile(r"(?<=://)[^?#]*@")


def public_url(url: str) -> str:
    """The URL as it may be shown: credentials (`user:password@`) replaced by `***@`, control
    characters dropped."""
    return "".join(ch for ch in _USERINFO.sub("***@", url, count=1) if ch >= " " and ch != "\x7f")


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:160]

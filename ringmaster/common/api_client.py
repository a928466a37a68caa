"""A client of a job's control API for the commands that talk to a running job (`scale`,
`status`, `events`): the job secret as a bearer token, an optional CA for https, and errors that
say what the server answered (never a traceback, whatever came back)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ringmaster import settings as defaults
from ringmaster.common.errors import RingmasterError
from ringmaster.common.network import is_this_machine, this_machine_names

#: Most bytes read from one answer (the status of a large job is well under this).
MAX_ANSWER_BYTES = 16 << 20


class ApiError(RingmasterError):
    """The control API could not be reached or refused; the message says which and why, `status`
    the HTTP status of a refusal (None: no answer came)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ApiClient:
    def __init__(self, api: str, secret: str | None, tls_ca: str | None = None,
                 timeout_s: float = defaults.API_CLIENT_TIMEOUT_S, tls_ca_pem: str | None = None) -> None:
        """`tls_ca`: the CA file an https:// API's certificate chains to (or `tls_ca_pem`, its PEM)."""
        parsed = urllib.parse.urlparse(api)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ApiError(f"--api {api}: give the control API's URL, e.g. http://127.0.0.1:8080 (printed at start)")
        if (parsed.scheme == "http" and secret is not None
                and not is_this_machine(parsed.hostname or "", this_machine_names())):
            raise ApiError(f"--api {api}: would send the job secret in the clear to {parsed.hostname}, another "
                           "machine; use the job's https:// URL (a job started with --tls-cert), or run this command "
                           "on that machine")
        self.api = api.rstrip("/")
        self._secret = secret
        self._context = ssl.create_default_context(cafile=tls_ca) if tls_ca else \
            ssl.create_default_context(cadata=tls_ca_pem) if tls_ca_pem else None
        self._timeout_s = timeout_s

    def get(self, path: str, **query: object) -> Any:
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        return self._call(urllib.request.Request(f"{self.api}{path}{suffix}", headers=self._headers()))

    def post(self, path: str, body: object) -> Any:
        headers = {**self._headers(), "Content-Type": "application/json"}
        return self._call(urllib.request.Request(f"{self.api}{path}", data=json.dumps(body).encode(), method="POST",
                                                 headers=headers))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._secret}"} if self._secret is not None else {}

    def _call(self, request: urllib.request.Request) -> Any:
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._context) as response:
                raw = response.read(MAX_ANSWER_BYTES)
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{self.api} answered HTTP {exc.code}: {answer_field(exc.read(4096), 'detail')}",
                           exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"cannot reach the control API at {self.api}: {exc}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(f"{self.api} did not answer as a Ringmaster control API: {answer_field(raw, '')}") from None


def answer_field(raw: bytes, field: str) -> str:
    """The `field` of a JSON answer, or the start of whatever else came (not a traceback)."""
    try:
        value = json.loads(raw)[field]
    except (ValueError, TypeError, KeyError, IndexError):
        text = raw[:300].decode(errors="replace").strip()
        return f"(not a Ringmaster answer) {text}" if text else "(empty answer)"
    return value if isinstance(value, str) else json.dumps(value)

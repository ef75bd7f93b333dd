"""The coordinator's URL as users type it, and the one wording of "unreachable" (and of an error
answer's detail) that ``kernelfleet admin``, ``import``, ``worker``, ``pull`` and ``settings push``
share (imports only the standard library and httpx).

- ``127.0.0.1:8600`` (no scheme) is refused with "add http://", not an UnsupportedProtocol error;
- a URL ending in ``/api/v1`` (copied from the API docs) means the coordinator at its root;
- no answer reads "cannot reach the coordinator at URL (connection refused): is `kernelfleet serve`
  running there? Check --coordinator or KERNELFLEET_COORDINATOR."
"""

from __future__ import annotations

import httpx

API_PREFIX = "/api/v1"


class BadCoordinatorUrl(ValueError):
    pass


def coordinator_base(url: str) -> str:
    """``url`` without a trailing slash or ``/api/v1``; :class:`BadCoordinatorUrl` when it has no
    http:// or https:// scheme."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise BadCoordinatorUrl(f"the coordinator URL {url!r} has no scheme: add http:// "
                                f"(e.g. --coordinator http://{text or '127.0.0.1:8600'})")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise BadCoordinatorUrl(f"the coordinator URL {url!r} must look like http://HOST:PORT "
                                "(or https://...)")
    text = text.rstrip("/")
    if text.endswith(API_PREFIX):
        text = text[: -len(API_PREFIX)].rstrip("/")
    return text


def _reason(exc: BaseException) -> str:
    text = str(exc).lower()
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text or "resolution" in text:
        return "unknown host"
    return type(exc).__name__


def answer_detail(r: httpx.Response, limit: int = 300) -> str:
    """What a coordinator's error answer says: its JSON ``detail``, else the first ``limit``
    characters of its body (a proxy's page, say)."""
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text[:limit]


def unreachable_message(base: str, exc: BaseException) -> str:
    return (f"cannot reach the coordinator at {base} ({_reason(exc)}): is `kernelfleet serve` running "
            f"there? Check --coordinator or KERNELFLEET_COORDINATOR.")

"""The dashboard's exception hierarchy. Each error becomes a friendly HTML page with its status."""

from __future__ import annotations


class WebError(Exception):
    status_code = 400
    title = "Bad request"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadParam(WebError):
    status_code = 400
    title = "Bad filter"


class PageNotFound(WebError):
    status_code = 404
    title = "Not found"

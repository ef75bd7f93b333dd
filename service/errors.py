"""The coordinator's exception hierarchy. Each error carries the HTTP status it maps to and a
message a person can act on; :mod:`kernelfleet.service.app` renders it as ``{"detail": message}``."""

from __future__ import annotations


class CoordinatorError(Exception):
    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorized(CoordinatorError):
    status_code = 401


class Forbidden(CoordinatorError):
    status_code = 403


class NotFound(CoordinatorError):
    status_code = 404


class Conflict(CoordinatorError):
    status_code = 409


class Invalid(CoordinatorError):
    status_code = 422

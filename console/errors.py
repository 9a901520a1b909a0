"""Domain errors, raised by services and mapped to HTTP statuses once (API) or messages (UI)."""


class DomainError(Exception):
    status = 400


class Invalid(DomainError):
    """The request names something unusable: a missing path, a bad name. Nothing was stored."""

    status = 422


class NotFound(DomainError):
    status = 404


class Conflict(DomainError):
    status = 409

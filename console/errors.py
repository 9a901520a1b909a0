"""Domain errors, raised by services and mapped to HTTP statuses once (API) or messages (UI).

Each carries the API's one error shape: a list of `{"loc", "msg", "type"}` items, `loc` naming the field
at fault (`["body", "replicas"]`) or empty when the refusal is about the request as a whole."""

from __future__ import annotations


class DomainError(Exception):
    status = 400
    type = "invalid"

    def __init__(self, message: str, field: str | None = None, *, errors: list[dict] | None = None):
        super().__init__(message)
        self.field = field
        self._errors = errors

    @property
    def errors(self) -> list[dict]:
        if self._errors:
            return self._errors
        return [{"loc": ["body", self.field] if self.field else [], "msg": str(self), "type": self.type}]

    @property
    def fields(self) -> list[str]:
        """The fields the refusal is about, for a form to point at."""
        return [str(e["loc"][1]) for e in self.errors if len(e["loc"]) > 1]


class Invalid(DomainError):
    """The request names something unusable: a missing path, a bad name. Nothing was stored."""

    status = 422
    type = "invalid"


class Forbidden(DomainError):
    """The caller may not do this (another user's token, an administrator's task); nothing was changed."""

    status = 403
    type = "forbidden"


class NotFound(DomainError):
    status = 404
    type = "not_found"


class Conflict(DomainError):
    status = 409
    type = "conflict"


class Unavailable(DomainError):
    """What the request needs cannot be reached now (a host whose agent is not connected); later it may be."""

    status = 503
    type = "unavailable"


class AgentRefused(DomainError):
    """An agent answered with an error of its own; the message passes its words on."""

    status = 502
    type = "agent_error"


class AgentTimeout(DomainError):
    """An agent did not answer in time."""

    status = 504
    type = "timeout"


def pydantic_items(errors: list[dict], prefix: tuple[str, ...] = ()) -> list[dict]:
    """pydantic's error dicts as the API's items: pydantic's words with the refused value (a short scalar
    only: the input may be a whole hostile body), a rule of ours (a ValueError) as written."""
    items = []
    for e in errors:
        msg = str(e.get("msg", ""))
        if e.get("type") == "value_error":
            msg = msg.removeprefix("Value error, ")
        else:
            value = e.get("input")
            shown = isinstance(value, bool | int | float | str | None) and len(repr(value)) <= 80 and "input" in e
            msg = f"{msg[:1].lower()}{msg[1:]}" + (f", got {value!r}" if shown else "")
        items.append({"loc": [*prefix, *e.get("loc", ())], "msg": msg, "type": str(e.get("type", "invalid"))})
    return items


def describe(items: list[dict]) -> str:
    """The items as one sentence for a page: "replicas: input should be ...; seq: ..."."""
    def where(loc: list) -> str:
        return ".".join(str(p) for p in loc if p not in ("body", "query", "path"))

    def sentence(item: dict) -> str:
        field = where(item["loc"])  # named once: a rule of ours already starts with its field
        return f"{field}: {item['msg']}" if field and not item["msg"].startswith(field) else item["msg"]
    return "; ".join(sentence(i) for i in items)

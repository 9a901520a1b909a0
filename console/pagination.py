"""Paging and name search for lists, shared by the REST API and the pages.

The API takes `?page=N&per_page=M` and keeps its body a plain JSON list (clients read a list); the paging
travels in headers, as GitHub's API does: `X-Total-Count` and an RFC 8288 `Link` with first, prev, next
and last. The pages take the same words in their own query strings and never refuse one: a bad value
falls back to the default and the page says so."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from ninja import Field, Schema

DEFAULT_PER_PAGE = 100
MAX_PER_PAGE = 500
# Far past any real list; keeps OFFSET inside what every database accepts (SQLite refuses past 2**63).
MAX_PAGE = 1_000_000
MAX_QUERY = 200  # the longest name of anything listed (hosts)


class ListQuery(Schema):
    """The query parameters every list takes."""

    page: int = Field(1, ge=1, le=MAX_PAGE, description="which page, from 1; past the last page the list is empty")
    per_page: int = Field(DEFAULT_PER_PAGE, ge=1, le=MAX_PER_PAGE, description=f"rows per page, at most {MAX_PER_PAGE}")
    q: str = Field("", max_length=MAX_QUERY, description="only rows whose name contains this, case-insensitive")


@dataclass(frozen=True)
class Page:
    """One page of a list: which one, its size, and how many rows the whole (filtered) list has."""

    number: int
    per_page: int
    total: int

    @property
    def last(self) -> int:
        """The last page's number; 1 for an empty list (page 1 exists, empty)."""
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.per_page

    @property
    def first_row(self) -> int:
        """The 1-based position of its first row, for "26–50 of 1,000"; 0 when it has none."""
        return self.offset + 1 if self.offset < self.total else 0

    @property
    def last_row(self) -> int:
        return min(self.offset + self.per_page, self.total)

    @property
    def previous(self) -> int | None:
        # Past the end, "previous" is the last page that has rows, not number - 1 (GitHub's answer is an
        # empty page that links to another empty page).
        return min(self.number - 1, self.last) if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.last else None


def paginate(rows: QuerySet, number: int, per_page: int) -> tuple[Page, QuerySet]:
    """The page of `rows` (an ordered queryset) and its rows: one COUNT and one sliced query."""
    page = Page(number, per_page, rows.count())
    return page, rows[page.offset:page.offset + per_page]


def name_search(rows: QuerySet, q: str) -> QuerySet:
    """Rows whose name contains `q`, case-insensitive (LIKE's wildcards in `q` are taken literally)."""
    if "\x00" in q:  # no name holds a NUL, and PostgreSQL refuses one in a query
        return rows.none()
    return rows.filter(name__icontains=q) if q else rows


def page_url(path: str, query: QueryDict | dict, number: int, param: str = "page") -> str:
    """`path` with the same query string and page `number`: filters and the other lists' pages are kept."""
    params = QueryDict(mutable=True)
    params.update(query)  # a QueryDict keeps repeated keys; a dict gives one each
    params[param] = str(number)
    return f"{path}?{params.urlencode()}"


def link_header(request: HttpRequest, page: Page) -> str:
    """RFC 8288 links to the first, previous, next and last pages, absolute as clients expect."""
    base = request.build_absolute_uri(request.path)
    rels = {"first": 1, "prev": page.previous, "next": page.next, "last": page.last}
    return ", ".join(f'<{page_url(base, request.GET, n)}>; rel="{rel}"' for rel, n in rels.items() if n is not None)


def set_page_headers(response: HttpResponse, request: HttpRequest, page: Page) -> None:
    """The paging of a JSON-list response: X-Total-Count and Link."""
    response["X-Total-Count"] = str(page.total)
    response["Link"] = link_header(request, page)


# -- the pages: lenient parsing ------------------------------------------------------------------------------


def page_number(query: QueryDict | dict, param: str = "page") -> tuple[int, str | None]:
    """The page asked for in a page's query string, and a note when it was not a page number (1 then)."""
    raw = query.get(param, "")
    if raw in ("", None):
        return 1, None
    try:
        number = int(raw)
    except (TypeError, ValueError):
        number = 0
    if not 1 <= number <= MAX_PAGE:
        return 1, f"{param} “{shown(raw)}” is not a page number; showing page 1"
    return number, None


def shown(raw) -> str:
    """A refused query value as a page may quote it: short, control characters as "?"."""
    return "".join(c if c.isprintable() else "?" for c in str(raw)[:20])


def page_within(rows: QuerySet, number: int, per_page: int, param: str = "page") -> tuple[Page, QuerySet, str | None]:
    """Like paginate(), but a page past the end shows the last one (a fleet that shrank under a bookmark),
    with a note saying so."""
    page, window = paginate(rows, number, per_page)
    if number <= page.last:
        return page, window, None
    note = f"{param} {number} is past the last page ({page.last}); showing page {page.last}"
    page = Page(page.last, per_page, page.total)
    return page, rows[page.offset:page.offset + per_page], note


def query_string(query: QueryDict | dict, drop: tuple[str, ...] = ()) -> str:
    """The query string of `query` without the parameters in `drop` (for links that reset a page)."""
    if isinstance(query, QueryDict):
        params = query.copy()
        for name in drop:
            params.pop(name, None)
        return params.urlencode()
    return urlencode({k: v for k, v in query.items() if k not in drop})


def pager(page: Page, query: QueryDict | dict, param: str = "page", around: int = 2) -> dict:
    """What a page's pager shows: the rows shown of how many, and links (relative, the query string kept)
    to the first, previous, next and last pages and to the pages around this one, with gaps as None."""
    def url(n: int) -> str:
        return page_url("", query, n, param)

    shown = sorted({1, page.last, *range(max(1, page.number - around), min(page.last, page.number + around) + 1)})
    numbers: list[dict | None] = []
    for n in shown:
        if numbers and numbers[-1] is not None and n - numbers[-1]["number"] > 1:
            numbers.append(None)
        numbers.append({"number": n, "url": url(n), "current": n == page.number})
    return {"page": page, "numbers": numbers if page.last > 1 else [],
            "previous": url(page.previous) if page.previous else None,
            "next": url(page.next) if page.next else None}

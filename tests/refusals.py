"""Reading the REST API's one error shape: `{"detail": [{"loc", "msg", "type"}, ...]}`."""

from __future__ import annotations


def refusal(response) -> str:
    """The refusal's messages joined, after checking the body has the documented shape."""
    items = response.json()["detail"]
    assert isinstance(items, list) and items, items
    for item in items:
        assert set(item) == {"loc", "msg", "type"}, item
        assert isinstance(item["loc"], list) and isinstance(item["msg"], str) and isinstance(item["type"], str)
    return "; ".join(item["msg"] for item in items)


def refused_fields(response) -> list[str]:
    """The fields the refusal names (the part of each item's loc after "body", "query" or "path")."""
    return [str(item["loc"][1]) for item in response.json()["detail"] if len(item["loc"]) > 1]

from __future__ import annotations

from datetime import datetime

from ninja import Schema


class ModelIn(Schema):
    name: str
    path: str


class ModelOut(Schema):
    name: str
    path: str
    architecture: str
    model_type: str
    task: str
    stored_dtype: str
    parameters: int
    weights_bytes: int
    estimate_bytes: int
    estimate: dict
    created: datetime


class ErrorOut(Schema):
    detail: str

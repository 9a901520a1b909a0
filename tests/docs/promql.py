"""The metric names a PromQL expression (or a Grafana variable query) reads, and every name the console and the
agent expose once their families are registered: what the dashboard and alert-rule tests compare."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

# Words of PromQL that are not metric names where they stand outside braces, brackets and label lists.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
            "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount"), "unknown": ("",)}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|\w+)")  # Grafana's $deployment, ${window}, $__rate_interval
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*)\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """Names of the series `expr` selects: identifiers that are not functions, aggregations, keywords, labels."""
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("1", text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    return {name for name, call in _NAME.findall(text) if not call and name.lower() not in KEYWORDS}


def variable_query_names(query: str) -> set[str]:
    """Names a Grafana Prometheus variable query reads: label_values(selector, label), query_result(expr)."""
    found = _LABEL_VALUES.match(query)
    if found:
        selector, _, _label = found.group(1).rpartition(",")
        return metric_names(selector) if selector else set()  # label_values(label) reads no particular metric
    inner = re.match(r"^\s*query_result\((.*)\)\s*$", query, re.S)
    return metric_names(inner.group(1) if inner else query)


def exposed_names(*registries: CollectorRegistry) -> set[str]:
    """Every sample name the registries' families can have, as Prometheus stores them (suffixes included)."""
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names

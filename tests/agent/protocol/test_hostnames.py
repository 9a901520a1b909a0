"""The host name rule (agent/protocol/hostnames.py): the names machines give themselves pass; look-alike letters of
other scripts and what would end up in URLs and page titles do not, each refused with the reason."""

import pytest

from agent.protocol.hostnames import host_name_problem, is_host_name


@pytest.mark.parametrize("name", ["local", "h1", "gpu-1", "node01.cluster.example.com", "Johns-MacBook-Pro.local",
                                  "gpu_node-7", "a" * 63 + ".b", "x" * 63 + "." + "y" * 63 + "." + "z" * 63])
def test_the_names_machines_give_themselves_are_host_names(name):
    assert host_name_problem(name) is None and is_host_name(name)


@pytest.mark.parametrize("name, said", [
    ("gpu-\u0430", "has 'а' (CYRILLIC SMALL LETTER A, U+0430: host names are ASCII) at position 4"),
    ("g\u0440u-1", "CYRILLIC SMALL LETTER ER, U+0440"),
    ("gpu\u200b1", "(a space or control character) at position 3"),
    ("gpu/1", "has '/' (a path separator: host names end up in URLs and page titles) at position 3"),
    ("gpu?x=1", "has '?' (a URL's query mark"),
    ("gpu#1", "has '#' (a URL's fragment mark"),
    ("two words", "has ' ' (a space or control character)"),
    ("", "is empty"),
    ("x" * 201, "is 201 characters long, above 200"),
    ("a" * 64, "has a label of 64 characters"),
    ("gpu..1", "has an empty label"),
    (".gpu", "has an empty label"),
    ("-gpu", "has the label '-gpu', which does not start and end with a letter or digit"),
    ("gpu.1_", "has the label '1_'"),
    (7, "is not a string"),
])
def test_anything_else_is_refused_saying_why(name, said):
    problem = host_name_problem(name)
    assert problem is not None and said in problem, problem
    assert not is_host_name(name)

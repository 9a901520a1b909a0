"""An agent's advertised inference endpoint is a base URL and nothing more: http or https, a host and a port, no
path, query, fragment or user info. The console builds every URL to an agent from its parts, so an endpoint like
`http://127.0.0.1:6379/x?` cannot make it fetch anything else."""

import json

import pytest
from pydantic import ValidationError

from agent.protocol import parse_agent_message
from agent.protocol.messages import endpoint_parts


def hello(endpoint: str) -> str:
    return json.dumps({"type": "hello", "protocol": 1, "host": "h1", "agent_version": "1", "endpoint": endpoint,
                       "gpus": []})


REFUSED = {
    "a path and an empty query": "http://127.0.0.1:8100/v2/health/live?",
    "a path": "http://10.0.0.1:8100/metrics",
    "a lone slash": "http://10.0.0.1:8100/",
    "a query": "http://10.0.0.1:8100?x=1",
    "an empty query": "http://10.0.0.1:8100?",
    "a fragment": "http://10.0.0.1:8100#x",
    "user info": "http://user:pw@10.0.0.1:8100",
    "another scheme": "file://10.0.0.1:8100",
    "a unix socket": "http+unix://%2Ftmp%2Fsock",
    "no host": "http://:8100",
    "a port past 65535": "http://10.0.0.1:65536",
    "port zero": "http://10.0.0.1:0",
    "a port that is no number": "http://10.0.0.1:http",
    "a space": "http://10.0.0.1 :8100",
    "a backslash": "http://10.0.0.1\\@evil:8100",
    "no scheme": "10.0.0.1:8100",
    "an unclosed IPv6 bracket": "http://[::1:8100",
}


@pytest.mark.parametrize("endpoint", REFUSED.values(), ids=REFUSED.keys())
def test_an_endpoint_with_more_or_less_than_a_base_url_fails_validation(endpoint):
    with pytest.raises(ValidationError) as refused:
        parse_agent_message(hello(endpoint))
    assert "scheme://host:port" in str(refused.value)


ACCEPTED = {
    "": None,
    "http://10.0.0.11:8100": ("http", "10.0.0.11", 8100),
    "https://gpu-a.example.com:443": ("https", "gpu-a.example.com", 443),
    "https://gpu-a.example.com": ("https", "gpu-a.example.com", 443),
    "http://[::1]:8100": ("http", "[::1]", 8100),
    "HTTP://GPU-A:8100": ("http", "gpu-a", 8100),
    "http://gpu_a.local:8100": ("http", "gpu_a.local", 8100),
}


@pytest.mark.parametrize(("endpoint", "parts"), ACCEPTED.items(), ids=[e or "none" for e in ACCEPTED])
def test_a_base_url_or_none_is_taken_and_its_parts_are_read_back(endpoint, parts):
    assert parse_agent_message(hello(endpoint)).endpoint == endpoint
    assert endpoint_parts(endpoint) == parts

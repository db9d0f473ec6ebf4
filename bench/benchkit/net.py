"""HTTP on the loopback: free ports, one request, and the fake provider's answers and counts."""

import http.client
import json
import socket
from urllib.parse import urlsplit

from .common import HOST, UPSTREAM_PORT, BenchError


def port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((HOST, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_ports(first, count, bus=False):
    """`count` free loopback ports from `first` up (`bus`: Cluster nodes, port + 10000 free too)."""
    out = []
    for port in range(first, first + 1000):
        if port_free(port) and (not bus or port_free(port + 10000)):
            out.append(port)
            if len(out) == count:
                return out
    raise BenchError(f"no {count} free ports from {first} up")


def http_request(method, url, body=None, headers=None, timeout=2.0):
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        path = u.path + (("?" + u.query) if u.query else "")
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def chat_ok(url):
    status, body = http_request("POST", url, b"{}", {"content-type": "application/json"})
    return status == 200 and b"chat.completion" in body


def upstream_count(key):
    """The requests the fake provider received with `x-fake-key: key` (None if it did not say)."""
    status, body = http_request("GET", f"http://{HOST}:{UPSTREAM_PORT}/_fake/count?key={key}")
    return json.loads(body)["count"] if status == 200 else None

"""Idle client connections held by the harness itself (the scale mode): each sends one POST, reads
its whole response, then stays open and silent."""

import errno
import selectors
import socket
import time
from urllib.parse import urlsplit

from .common import BenchError


def http_response_done(buf):
    """(status, headers) once `buf` holds one complete HTTP/1.1 response, else None."""
    i = buf.find(b"\r\n\r\n")
    if i < 0:
        return None
    lines = buf[:i].decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = buf[i + 4 :]
    if "content-length" in headers:
        if len(body) < int(headers["content-length"]):
            return None
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        if not body.endswith(b"0\r\n\r\n"):
            return None
    else:
        headers["connection"] = "close"  # no framing: the server has to close it
    return status, headers


class IdleConnections:
    """Client connections held open by the harness itself: each sends one POST and reads its whole
    response, then stays open and silent. Opened `batch` at a time (non-blocking sockets, one
    epoll selector), so that the proxy's listen backlog is never overrun."""

    def __init__(self):
        self.socks = []
        self.failed = {}

    def fail(self, kind, s=None):
        self.failed[kind] = self.failed.get(kind, 0) + 1
        if s is not None:
            s.close()

    def open(self, url, n, batch, key, timeout=30.0):
        u = urlsplit(url)
        if not u.hostname.startswith("127."):
            raise BenchError("refusing to open connections to a non-loopback address")
        body = b"{}"
        request = (
            f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nx-fake-key: {key}\r\n\r\n"
        ).encode("latin-1") + body
        with selectors.DefaultSelector() as sel:
            for start in range(0, n, batch):
                self.open_batch(sel, u, request, min(n, start + batch) - start, timeout)

    def open_batch(self, sel, u, request, count, timeout):
        """`count` connections opened at once, each until its response ended (or `timeout` s)."""
        pending = {}
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex((u.hostname, u.port))
            if err not in (0, errno.EINPROGRESS):
                self.fail(f"connect: {errno.errorcode.get(err, err)}", s)
                continue
            st = {"sock": s, "buf": b"", "sent": False}
            sel.register(s, selectors.EVENT_WRITE, st)
            pending[s] = st
        deadline = time.monotonic() + timeout

        def drop(s, kind):
            sel.unregister(s)
            pending.pop(s)
            self.fail(kind, s)

        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for s in list(pending):
                    drop(s, "timeout")
                break
            for k, _ in sel.select(timeout=min(left, 1.0)):
                st = k.data
                s = st["sock"]
                outcome = self.advance(sel, st, request)
                if outcome is True:
                    sel.unregister(s)
                    pending.pop(s)
                    self.socks.append(s)
                elif outcome is not None:
                    drop(s, outcome)

    @staticmethod
    def advance(sel, st, request):
        """One ready connection a step on: its request sent once it is writable, then its response
        read. Returns None while it is not done, True once its response ended and the connection
        stays open, else why it failed."""
        s = st["sock"]
        if not st["sent"]:
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                return f"connect: {errno.errorcode.get(err, err)}"
            try:
                if s.send(request) != len(request):
                    return "short write"
            except OSError as e:
                return f"write: {type(e).__name__}"
            st["sent"] = True
            sel.modify(s, selectors.EVENT_READ, st)
            return None
        try:
            data = s.recv(65536)
        except BlockingIOError:
            return None
        except OSError as e:
            return f"read: {type(e).__name__}"
        if not data:
            return "closed before the response ended"
        st["buf"] += data
        try:
            done = http_response_done(st["buf"])
        except (ValueError, IndexError):
            return "bad response"
        if done is None:
            return None
        status, headers = done
        if not 200 <= status < 300:
            return f"status {status}"
        if headers.get("connection", "").lower() == "close":
            return "not kept alive"
        return True

    def closed_by_peer(self):
        """Held connections the proxy closed (or sent anything on) since they went idle."""
        closed = 0
        with selectors.DefaultSelector() as sel:
            for s in self.socks:
                sel.register(s, selectors.EVENT_READ)
            ready = sel.select(timeout=0)
        for k, _ in ready:
            closed += 1
        return closed

    def close(self):
        for s in self.socks:
            s.close()
        self.socks = []

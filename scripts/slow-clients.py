#!/usr/bin/env python3
"""Hold N slow connections to a running `gpuledger serve` and time /healthz meanwhile.

Usage: scripts/slow-clients.py HOST PORT N INGEST_TOKEN

A third of the connections send nothing, a third half a request head, a third a push head
(with the token and Content-Length: 1000) and one byte of body. Then 20 GET /healthz, each on a
new connection, are timed. Prints how many slow connections the server kept open and the
median and slowest /healthz. docs/configuration.md has the figures.
"""
import http.client
import socket
import statistics
import sys
import time

host, port, n, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
held, failed = [], 0
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
    except OSError:
        failed += 1
        continue
    if i % 3 == 1:
        s.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\n")
    elif i % 3 == 2:
        s.sendall(
            (
                "POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                "Content-Length: 1000\r\n\r\n{" % token
            ).encode()
        )
    held.append(s)
time.sleep(0.5)
latencies, errors = [], 0
for _ in range(20):
    start = time.monotonic()
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        c.close()
        errors += r.status != 200
    except OSError:
        errors += 1
    latencies.append(time.monotonic() - start)
latencies.sort()
still_open = 0
for s in held:
    s.setblocking(False)
    try:
        still_open += s.recv(1) != b""
    except BlockingIOError:
        still_open += 1
    except OSError:
        pass
print(
    f"{n} slow connections: {failed} could not connect, {still_open} still open; /healthz "
    f"median {statistics.median(latencies) * 1000:.2f} ms, max {latencies[-1] * 1000:.2f} ms, "
    f"{errors} failed"
)

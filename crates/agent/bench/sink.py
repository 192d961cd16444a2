"""A local HTTP sink for the agent benchmarks: answers every POST like gpuledger's ingest
endpoint (200, empty counts), appends each body's size to WORK/posts, and writes its port to
WORK/port. Usage: python3 sink.py WORK"""
import http.server
import json
import os
import sys

work = sys.argv[1]
REPLY = json.dumps({"accepted": {"gpus": 0, "samples": 0, "allocations": 0},
                    "duplicates": {"gpus": 0, "samples": 0, "allocations": 0},
                    "rejected": []}).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get('Content-Length', 0))
        self.rfile.read(n)
        with open(os.path.join(work, 'posts'), 'a') as f:
            f.write('%d\n' % n)
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(REPLY)))
        self.end_headers()
        self.wfile.write(REPLY)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(('127.0.0.1', 0), Handler)
with open(os.path.join(work, 'port'), 'w') as f:
    f.write(str(server.server_address[1]))
server.serve_forever()

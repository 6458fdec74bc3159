"""A stranger's fake recovery controller on a node's loopback (tests/integration/test_security_ckpt_run.sh): it
answers every read of a job with the view MODE names and every event with 200, and logs one line per request
(whether it carried the job owner's MUNGE credential). Modes:
  gave-up      {"state": "gave-up"}, unsigned
  relaunch     {"state": "relaunching", "relaunch_step": 0, "exclude": ["n1"]}, unsigned
  self-signed  gave-up, signed with the stranger's own MUNGE credential over the right payload
  mistyped     {"state": 7, "relaunch_step": "x", "exclude": {"a": 1}}

    python3 fake_controller.py PORT MODE MUNGE_SOCKET
"""
import hashlib
import http.server
import json
import subprocess
import sys

PORT, MODE, SOCKET = int(sys.argv[1]), sys.argv[2], sys.argv[3]
VIEWS = {
    "gave-up": {"state": "gave-up", "reason": "a stranger says so"},
    "self-signed": {"state": "gave-up", "reason": "a stranger says so, signed"},
    "relaunch": {"state": "relaunching", "relaunch_step": 0, "exclude": ["n1"], "clock": {"decided": 1.0}},
    "mistyped": {"state": 7, "relaunch_step": "x", "exclude": {"a": 1}},
}


class Fake(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        cred = self.headers.get("X-Ckpt-Credential", "")
        body = (json.dumps(VIEWS[MODE]) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if MODE == "self-signed":
            payload = "REPLY %s %s" % (hashlib.sha256(cred.encode()).hexdigest(), hashlib.sha256(body).hexdigest())
            sig = subprocess.run(["munge", "-S", SOCKET, "-s", payload], capture_output=True, text=True).stdout.strip()
            self.send_header("X-Ckpt-Reply-Credential", sig)
        self.end_headers()
        self.wfile.write(body)
        print(f"GET {self.path} credential={'yes' if cred else 'no'}", flush=True)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        print(f"POST {self.path}", flush=True)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Fake).serve_forever()

"""Conformance replay: the same JSON-RPC calls go to the real aria2c and to `stitch serve`, and the SHAPES of the
answers are compared — object keys, value types, array emptiness, error codes, HTTP statuses and content types —
with the differences Stitch makes on purpose listed in one place (intended.py, beside this file).

    python3 replay.py STITCH_BINARY NGINX_DIR [--aria2c PATH] [--verbose] [--only LABEL_GLOB]

Values are not compared (GIDs, speeds, paths and versions differ legitimately), except a few that tell whether both
servers are in the same state: `status`, `errorCode`, a download's `gid` (each server's GIDs are mapped back to the
scenario's names), and a result that is a plain string or number ("OK", a position, a GID). Keys Stitch adds under
`stitch.` are allowed. Exit 1 when any difference is not listed in intended.py (or the replay itself failed).

Standard library only (run by scripts/conformance.sh; needs aria2c 1.36 and nginx from scripts/nginx.sh).
"""
import base64
import fnmatch
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from intended import INTENDED  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------
# Command line


def usage():
    print(__doc__.strip().splitlines()[3], file=sys.stderr)
    sys.exit(2)


args = sys.argv[1:]
verbose = "--verbose" in args
args = [a for a in args if a != "--verbose"]
aria2c_bin = "/usr/bin/aria2c"
only = None
if "--aria2c" in args:
    i = args.index("--aria2c")
    aria2c_bin = args[i + 1]
    del args[i:i + 2]
if "--only" in args:
    i = args.index("--only")
    only = args[i + 1]
    del args[i:i + 2]
if len(args) != 2:
    usage()
stitch_bin, nginx_dir = args
ports_env = dict(line.strip().split("=", 1) for line in open(os.path.join(nginx_dir, "ports.env")) if "=" in line)
www = ports_env["NGINX_WWW"]
FAST = f"http://127.0.0.1:{ports_env['NGINX_HTTP_PORT']}"
SLOW = f"http://127.0.0.1:{ports_env['NGINX_SLOW_PORT']}"

# ----------------------------------------------------------------------------------------------------------------
# A minimal WebSocket client (RFC 6455: masked text frames out; text, continuation, ping, close in)


class WebSocket:
    def __init__(self, port, path="/jsonrpc", timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("WebSocket upgrade: connection closed")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode()
        if " 101 " not in status + " ":
            raise ConnectionError(f"WebSocket upgrade refused: {status}")
        expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        if expected not in head:
            raise ConnectionError("WebSocket upgrade: wrong Sec-WebSocket-Accept")
        self.lock = threading.Lock()
        self.closed = False

    def _frame(self, opcode, payload):
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        with self.lock:
            self.sock.sendall(head + mask + masked)

    def send(self, text):
        self._frame(0x1, text.encode() if isinstance(text, str) else text)

    def _exact(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("WebSocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv(self, timeout=None):
        """The next text message, or None on timeout. Raises ConnectionError when closed."""
        self.sock.settimeout(timeout)
        message = b""
        try:
            while True:
                b0, b1 = self._exact(2)
                opcode, n = b0 & 0x0F, b1 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", self._exact(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self._exact(8))[0]
                mask = self._exact(4) if b1 & 0x80 else None
                payload = self._exact(n)
                if mask:
                    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                if opcode == 0x8:
                    self.closed = True
                    raise ConnectionError("WebSocket closed by the server")
                if opcode == 0x9:
                    self._frame(0xA, payload)
                    continue
                if opcode == 0xA:
                    continue
                message += payload
                if b0 & 0x80:
                    return message.decode()
        except socket.timeout:
            return None

    def close(self):
        try:
            self._frame(0x8, struct.pack(">H", 1000))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------------------------
# The two servers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout}s")


class Server:
    """One server under test: its process, folder, port, GIDs by scenario name and saved results."""

    def __init__(self, name, work, secret):
        self.name = name
        self.secret = secret
        self.dir = os.path.join(work, name, "dl")
        os.makedirs(self.dir)
        self.work = os.path.join(work, name)
        self.log = open(os.path.join(self.work, "server.log"), "w+")
        self.gids = {}       # scenario name -> GID
        self.saved = {}      # label -> result
        self.notes = []      # notifications seen by the listener: (method, params)
        self.proc = None
        self.port = None
        self.listener = None

    def start(self):
        if self.name == "aria2":
            self.port = free_port()
            self.proc = subprocess.Popen(
                [aria2c_bin, "--enable-rpc", f"--rpc-listen-port={self.port}", f"--rpc-secret={self.secret}",
                 f"--dir={self.dir}", "--no-conf", "--quiet", "--rpc-listen-all=false",
                 f"--save-session={os.path.join(self.work, 'aria2.session')}"],
                stdout=self.log, stderr=self.log, cwd=self.work)
            wait_port(self.port, self.proc, "aria2c")
        else:
            secret_file = os.path.join(self.work, "secret")
            with open(secret_file, "w") as f:
                f.write(self.secret + "\n")
            os.chmod(secret_file, 0o600)
            env = {k: v for k, v in os.environ.items() if k != "STITCH_RPC_SECRET"}
            self.proc = subprocess.Popen(
                [stitch_bin, "serve", "--dir", self.dir, "--rpc-listen", "127.0.0.1:0", "--rpc-secret-file",
                 secret_file], stdout=self.log, stderr=self.log, cwd=self.work, env=env)
            deadline = time.monotonic() + 60
            while self.port is None:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.log.seek(0)
                    raise RuntimeError(f"stitch serve did not start ({self.proc.poll()}):\n{self.log.read()}")
                self.log.seek(0)
                found = re.search(r" on 127\.0\.0\.1:(\d+)", self.log.read())
                if found:
                    self.port = int(found.group(1))
                else:
                    time.sleep(0.05)
            wait_port(self.port, self.proc, "stitch serve")

    def listen(self):
        """A WebSocket that only collects notifications, on its own thread."""
        self.listener = WebSocket(self.port)

        def run():
            while True:
                try:
                    text = self.listener.recv(timeout=None)
                except (ConnectionError, OSError):
                    return
                try:
                    message = json.loads(text)
                except ValueError:
                    continue
                if isinstance(message, dict) and "method" in message and "id" not in message:
                    self.notes.append((message["method"], message.get("params"), current_step[0]))

        threading.Thread(target=run, daemon=True).start()

    def stop(self):
        if self.listener:
            self.listener.close()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- transports: each returns an Answer dict {status, ctype, body (parsed or None), raw}

    def http(self, method, target, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        all_headers = {"Host": f"127.0.0.1:{self.port}"}
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        try:
            conn.request(method, target, body=body, headers=all_headers)
            response = conn.getresponse()
            raw = response.read()
            ctype = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
            return {"status": response.status, "ctype": ctype, "raw": raw, "body": parse(raw)}
        finally:
            conn.close()

    def ws_exchange(self, text, timeout=10):
        """Sends TEXT over a fresh WebSocket; the first answer (not a notification), or None after TIMEOUT."""
        ws = WebSocket(self.port)
        try:
            ws.send(text)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"status": None, "ctype": None, "raw": b"", "body": None}
                try:
                    message = ws.recv(timeout=left)
                except ConnectionError:
                    return {"status": None, "ctype": None, "raw": b"", "body": None, "closed": True}
                if message is None:
                    return {"status": None, "ctype": None, "raw": b"", "body": None}
                parsed = parse(message.encode())
                if isinstance(parsed, dict) and "method" in parsed and "id" not in parsed:
                    continue  # a notification
                return {"status": None, "ctype": None, "raw": message.encode(), "body": parsed}
        finally:
            ws.close()


def parse(raw):
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None
    jsonp = re.fullmatch(r"([A-Za-z0-9_$.]+)\((.*)\);?", text, re.S)
    if jsonp:
        text = jsonp.group(2)
    try:
        return json.loads(text)
    except ValueError:
        return {"<not JSON>": text[:200]}


# ----------------------------------------------------------------------------------------------------------------
# Shapes


def kind(v):
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "array"
    return "object"


# numStoppedTotal's value only in the getGlobalStat calls (it would repeat in every later batch otherwise).
# Keys whose values are compared too (after GIDs are mapped to the scenario's names): they say whether both servers
# are in the same state.
VALUE_KEYS = {"status", "errorCode", "gid", "selected", "numActive", "numWaiting", "numStopped"}


def normalize(value, server):
    if isinstance(value, str):
        for name, gid in server.gids.items():
            if value == gid:
                return f"<gid {name}>"
    return value


def compare_shape(a, s, path, out, aria2, stitch, compare_value=False):
    ka, ks = kind(a), kind(s)
    if ka != ks:
        out.append((path, f"type: aria2 {ka} {short(a)}, stitch {ks} {short(s)}"))
        return
    if ka == "object":
        for k in a:
            if k not in s:
                out.append((f"{path}.{k}", f"missing in stitch (aria2: {short(a[k])})"))
            else:
                compare_shape(a[k], s[k], f"{path}.{k}", out, aria2, stitch, k in VALUE_KEYS or (
                    k == "numStoppedTotal" and current_step[0].startswith("getGlobalStat")))
        for k in s:
            if k not in a and not k.startswith("stitch."):
                out.append((f"{path}.{k}", f"extra in stitch ({short(s[k])})"))
    elif ka == "array":
        if bool(a) != bool(s):
            out.append((f"{path}[]", f"aria2 has {len(a)} elements, stitch {len(s)}"))
        if a and s and all(isinstance(x, dict) and "gid" in x for x in a + s):
            # downloads: paired by GID (mapped to the scenario's names), and their order compared
            na = [normalize(x["gid"], aria2) for x in a]
            ns = [normalize(y["gid"], stitch) for y in s]
            only_a = [g for g in na if g not in ns]
            only_s = [g for g in ns if g not in na]
            if only_a or only_s:
                out.append((f"{path}[].gid", f"listed by aria2 only: {only_a}, by stitch only: {only_s}"))
            common_a = [g for g in na if g in ns]
            common_s = [g for g in ns if g in na]
            if common_a != common_s:
                out.append((f"{path}[].gid", f"order: aria2 {common_a}, stitch {common_s}"))
            for x in a:
                g = normalize(x["gid"], aria2)
                if g in ns:
                    compare_shape(x, s[ns.index(g)], f"{path}[]", out, aria2, stitch)
            return
        for x, y in zip(a, s):
            compare_shape(x, y, f"{path}[]", out, aria2, stitch)
    elif compare_value:
        na, ns = normalize(a, aria2), normalize(s, stitch)
        if na != ns:
            out.append((path, f"value: aria2 {short(na)}, stitch {short(ns)}"))


def short(v, n=70):
    text = json.dumps(v) if not isinstance(v, str) else json.dumps(v)
    return text if len(text) <= n else text[:n - 3] + "..."


def compare_envelope(a, s, path, out, aria2, stitch, sent_id=None):
    """A JSON-RPC response (object), a batch answer (array), or None (no answer)."""
    if a is None or s is None:
        if a is not None or s is not None:
            out.append((f"{path}answer", f"aria2 {describe(a)}, stitch {describe(s)}"))
        return
    if isinstance(a, list) and isinstance(s, list):
        def keyed(items):
            table, nulls = {}, []
            for item in items:
                ident = item.get("id") if isinstance(item, dict) else None
                if ident is None:
                    nulls.append(item)
                else:
                    table[json.dumps(ident)] = item
            return table, nulls
        ta, na = keyed(a)
        ts, ns = keyed(s)
        for ident, item in ta.items():
            if ident in ts:
                compare_envelope(item, ts[ident], f"{path}[id={ident}].", out, aria2, stitch, json.loads(ident))
            else:
                out.append((f"{path}[id={ident}].answer", f"aria2 {describe(item)}, stitch no answer in the batch"))
        for ident, item in ts.items():
            if ident not in ta:
                out.append((f"{path}[id={ident}].answer", f"aria2 no answer in the batch, stitch {describe(item)}"))
        if len(na) != len(ns):
            out.append((f"{path}[id=null].answer", f"aria2 {len(na)} answers with id null, stitch {len(ns)}"))
        for x, y in zip(na, ns):
            compare_envelope(x, y, f"{path}[id=null].", out, aria2, stitch)
        return
    if kind(a) != kind(s) or not isinstance(a, dict):
        out.append((f"{path}answer", f"aria2 {describe(a)}, stitch {describe(s)}"))
        return
    if "error" in a and "error" in s:
        ca, cs = a["error"].get("code"), s["error"].get("code")
        if ca != cs:
            out.append((f"{path}error.code", f"aria2 {ca} ({a['error'].get('message')!r}), "
                                             f"stitch {cs} ({s['error'].get('message')!r})"))
        compare_shape(a["error"], s["error"], f"{path}error", out, aria2, stitch)
    elif "result" in a and "result" in s:
        compare_shape(a["result"], s["result"], f"{path}result", out, aria2, stitch, compare_value=True)
    else:
        out.append((f"{path}answer", f"aria2 {describe(a)}, stitch {describe(s)}"))
        return
    for k in a:
        if k not in ("result", "error") and k not in s:
            out.append((f"{path}{k}", "missing in stitch"))
    for k in s:
        if k not in ("result", "error") and k not in a:
            out.append((f"{path}{k}", "extra in stitch"))
    if a.get("id") != s.get("id"):
        out.append((f"{path}id", f"aria2 echoes {short(a.get('id'))}, stitch {short(s.get('id'))}"))


def describe(body):
    if body is None:
        return "no answer"
    if isinstance(body, dict) and "error" in body and isinstance(body["error"], dict):
        return f"error {body['error'].get('code')} ({body['error'].get('message')!r})"
    if isinstance(body, dict) and "result" in body:
        return f"result {short(body['result'], 50)}"
    return short(body, 60)


# ----------------------------------------------------------------------------------------------------------------
# The scenario: steps run in order, each against aria2c first, then stitch serve


class G:
    """A download's GID on the server the call goes to."""

    def __init__(self, name):
        self.name = name


class Dir:
    """A path inside the server's download folder."""

    def __init__(self, sub=""):
        self.sub = sub


def resolve(value, server):
    if isinstance(value, G):
        return server.gids[value.name]
    if isinstance(value, Dir):
        return os.path.join(server.dir, value.sub) if value.sub else server.dir
    if isinstance(value, list):
        return [resolve(v, server) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, server) for k, v in value.items()}
    if callable(value):
        return resolve(value(server), server)
    return value


def envelope(method, params, ident, token, server):
    params = resolve(params, server)
    if token is True:
        params = [f"token:{server.secret}"] + params
    elif isinstance(token, str):
        params = [token] + params
    call = {"jsonrpc": "2.0", "id": ident, "method": method}
    if params is not None:
        call["params"] = params
    return call


steps = []


def call(label, method, params=(), token=True, via="http", save=None, gid=None, ident=None):
    """One call. VIA: http (POST), ws, get, jsonp. SAVE keeps the result under LABEL; GID names the new download."""
    steps.append({"kind": "call", "label": label, "method": method, "params": list(params) if isinstance(
        params, (list, tuple)) else params, "token": token, "via": via, "save": save, "gid": gid,
        "ident": ident if ident is not None else label})


def raw(label, body, via="http", method="POST", target="/jsonrpc", headers=None, timeout=10):
    """A request built by BODY(server) -> bytes/str (or a GET target), sent as is."""
    steps.append({"kind": "raw", "label": label, "body": body, "via": via, "method": method, "target": target,
                  "headers": headers, "timeout": timeout})


def wait(label, condition, timeout=90):
    """Polls CONDITION(server, status_of) on both servers until it holds."""
    steps.append({"kind": "wait", "label": label, "condition": condition, "timeout": timeout})


def action(label, function):
    steps.append({"kind": "action", "label": label, "function": function})


def rpc(server, method, *params):
    """A direct call (not compared), for waits and set-up."""
    body = json.dumps(envelope(method, list(params), "w", True, server)).encode()
    answer = server.http("POST", "/jsonrpc", body)["body"]
    if not isinstance(answer, dict) or "result" not in answer:
        raise RuntimeError(f"{server.name}: {method}{params}: {answer}")
    return answer["result"]


def status_of(server, name, keys=("status", "completedLength", "totalLength")):
    return rpc(server, "aria2.tellStatus", server.gids[name], list(keys))


# The keys webui-aria2's gear dialog shows for a download (src/js/services/settings/settings.js, $fileSettings),
# with its own default for each: what it sends back for a key getOption did not list (a JS boolean or number is
# sent as such). A value of None is JS `undefined`: JSON.stringify leaves the key out.
WEBUI_FILE_SETTINGS = {
    "all-proxy": "", "all-proxy-passwd": "", "all-proxy-user": "", "allow-overwrite": False,
    "allow-piece-length-change": False, "always-resume": True, "async-dns": True, "auto-file-renaming": True,
    "bt-detach-seed-only": False, "bt-enable-hook-after-hash-check": True, "bt-enable-lpd": False,
    "bt-exclude-tracker": "", "bt-external-ip": "", "bt-force-encryption": False, "bt-hash-check-seed": True,
    "bt-max-open-files": 100, "bt-max-peers": 55, "bt-metadata-only": False, "bt-min-crypto-level": "plain",
    "bt-prioritize-piece": "", "bt-request-peer-speed-limit": "50K", "bt-require-crypto": False,
    "bt-save-metadata": False, "bt-seed-unverified": False, "bt-stop-timeout": 0, "bt-tracker": "",
    "bt-tracker-connect-timeout": 60, "bt-tracker-interval": 0, "bt-tracker-timeout": 60,
    "bt-remove-unselected-file": False, "check-certificate": True, "check-integrity": False,
    "conditional-get": False, "connect-timeout": 60, "continue": True, "daemon": False, "deferred-input": False,
    "dir": "", "disable-ipv6": False, "dry-run": False, "enable-async-dns6": False, "enable-color": True,
    "enable-dht": True, "enable-dht6": False, "enable-http-keep-alive": True, "enable-http-pipelining": False,
    "enable-peer-exchange": True, "enable-mmap": False, "enable-rpc": False, "file-allocation": None,
    "follow-metalink": True, "follow-torrent": True, "force-save": False, "ftp-passwd": "ARIA2USER@",
    "ftp-pasv": True, "ftp-proxy": "", "ftp-proxy-passwd": "", "ftp-proxy-user": "", "ftp-reuse-connection": True,
    "ftp-type": "binary", "ftp-user": "anonymous", "header": "", "http-accept-gzip": False,
    "http-auth-challenge": False, "http-no-cache": True, "http-user": "", "http-passwd": "", "http-proxy": "",
    "http-proxy-passwd": "", "http-proxy-user": "", "human-readable": True, "index-out": None,
    "lowest-speed-limit": "0", "max-connection-per-server": 1, "max-download-limit": "0", "max-file-not-found": 0,
    "max-resume-failure-tries": 0, "max-tries": 0, "max-upload-limit": "0", "metalink-enable-unique-protocol": True,
    "metalink-language": "", "metalink-location": "", "metalink-os": "", "metalink-version": "",
    "min-split-size": "20M", "no-conf": False, "no-file-allocation-limit": "5M", "no-netrc": True, "no-proxy": "",
    "out": "", "parameterized-uri": False, "pause-metadata": False, "proxy-method": "get", "quiet": False,
    "realtime-chunk-checksum": True, "referer": "", "remote-time": False, "remove-control-file": False,
    "reuse-uri": True, "seed-ratio": 0.0, "seed-time": 0, "select-file": "", "split": 5, "timeout": 60,
    "use-head": False, "user-agent": "aria2/$VERSION", "retry-wait": 0, "metalink-base-uri": "", "pause": "false",
    "rpc-allow-origin-all": False, "rpc-listen-all": False, "rpc-secure": False, "stream-piece-selector": "default",
    "show-console-readout": True, "show-files": False, "truncate-console-readout": True, "hash-check-only": False,
    "checksum": None, "piece-length": "1M", "uri-selector": "feedback",
}
WEBUI_WAITING_EXCLUDE = {"dry-run", "metalink-base-uri", "parameterized-uri", "pause", "piece-length"}
WEBUI_ACTIVE_INCLUDE = ["bt-max-peers", "bt-request-peer-speed-limit", "bt-remove-unselected-file",
                        "max-download-limit", "max-upload-limit"]
# AriaNg's list columns (tellActive/tellWaiting/tellStopped keys, src/scripts/services/aria2RpcService.js).
ARIANG_KEYS = ["gid", "totalLength", "completedLength", "uploadSpeed", "downloadSpeed", "connections", "numSeeders",
               "seeder", "status", "errorCode", "verifiedLength", "verifyIntegrityPending"]


def webui_gear(saved_label, active, change):
    """webui-aria2's gear dialog: getOption's value, else its own default, for every key it shows; all sent."""
    def build(server):
        values = server.saved[saved_label]
        sent = {}
        for key, default in WEBUI_FILE_SETTINGS.items():
            if active and key not in WEBUI_ACTIVE_INCLUDE:
                continue
            if not active and key in WEBUI_WAITING_EXCLUDE:
                continue
            value = values.get(key) or default  # JS `vals[i] || settings[i].val`
            if value is not None:
                sent[key] = value
        sent.update(change)
        return sent
    return build


def round_trip(saved_label, change):
    """getOption's whole object sent back to changeOption with CHANGE applied."""
    return lambda server: dict(server.saved[saved_label], **change)


def b64(params):
    return base64.b64encode(json.dumps(params).encode()).decode()


def get_target(method, params, ident, token=True, callback=None):
    def build(server):
        p = resolve(params, server)
        if token:
            p = [f"token:{server.secret}"] + p
        target = f"/jsonrpc?method={method}&id={ident}&params={b64(p)}"
        return target + (f"&jsoncallback={callback}" if callback else "")
    return build


def body_of(*calls, batch=False):
    """A body from (method, params, id[, token]) tuples: one call, or a batch."""
    def build(server):
        items = []
        for c in calls:
            method, params, ident = c[:3]
            token = c[3] if len(c) > 3 else True
            e = envelope(method, list(params), ident, token, server)
            if ident is None:
                del e["id"]
            items.append(e)
        return json.dumps(items if batch else items[0])
    return build


BIG = "conf-big.bin"      # 64 MiB, sparse: downloads from it at 100K/s stay active for the whole replay
SMALL = "conf-small.bin"  # 200 KB: finishes at once
MISSING = "conf-missing.bin"
LIMIT = "100K"


def downloads_settled(server):
    b, f = status_of(server, "B")["status"], status_of(server, "F")["status"]
    a, g = status_of(server, "A"), status_of(server, "G")
    return (b == "complete" and f == "error" and a["status"] == "active" and int(a["completedLength"]) > 0
            and g["status"] == "active" and int(g["completedLength"]) > 0)


def has_status(name, wanted):
    return lambda server: status_of(server, name)["status"] in wanted


def build_scenario():
    # -- before any download
    call("getVersion", "aria2.getVersion")
    call("getSessionInfo", "aria2.getSessionInfo")
    call("system.listMethods", "system.listMethods", token=False)
    call("system.listMethods with a token", "system.listMethods")
    call("system.listNotifications", "system.listNotifications", token=False)
    call("getGlobalStat empty", "aria2.getGlobalStat")
    call("getGlobalOption initial", "aria2.getGlobalOption", save="globalOption")
    call("tellActive empty", "aria2.tellActive")
    call("tellWaiting empty", "aria2.tellWaiting", [0, 10])
    call("tellStopped empty", "aria2.tellStopped", [0, 10])

    # -- adds: two active (slow, throttled), one complete, one failed, three paused
    call("addUri active A (out, max-download-limit)", "aria2.addUri",
         [[f"{SLOW}/{BIG}"], {"out": "a.bin", "max-download-limit": LIMIT}], gid="A")
    call("addUri complete B (dir inside the folder)", "aria2.addUri",
         [[f"{FAST}/{SMALL}"], {"out": "b.bin", "dir": Dir("sub")}], gid="B")
    call("addUri paused C (pause)", "aria2.addUri",
         [[f"{SLOW}/{BIG}"], {"out": "c.bin", "pause": "true", "max-download-limit": LIMIT}], gid="C")
    call("addUri paused D (split)", "aria2.addUri",
         [[f"{SLOW}/{BIG}"], {"out": "d.bin", "pause": "true", "split": "2", "max-download-limit": LIMIT}], gid="D")
    call("addUri paused E (position 0)", "aria2.addUri",
         [[f"{SLOW}/{BIG}"], {"out": "e.bin", "pause": "true", "max-download-limit": LIMIT}, 0], gid="E")
    call("addUri failing F (404)", "aria2.addUri", [[f"{FAST}/{MISSING}"], {"out": "f.bin"}], gid="F")
    call("addUri active G (two mirrors, split)", "aria2.addUri",
         [[f"{SLOW}/{BIG}", f"{FAST}/{BIG}"], {"out": "g.bin", "split": "2", "max-download-limit": LIMIT}], gid="G")
    call("addUri empty URI list", "aria2.addUri", [[]])
    call("addUri a string, not a list", "aria2.addUri", [f"{FAST}/{SMALL}"])
    call("addUri no params", "aria2.addUri", [])
    call("addUri options not an object", "aria2.addUri", [[f"{FAST}/{SMALL}"], "out=x.bin"])
    call("addUri bad option value", "aria2.addUri", [[f"{FAST}/{SMALL}"], {"split": "x"}])
    call("addTorrent", "aria2.addTorrent", [base64.b64encode(b"d4:infod4:name1:xee").decode()])
    call("addMetalink", "aria2.addMetalink", [base64.b64encode(b"<metalink/>").decode()])
    wait("B complete, F failed, A and G active with bytes", downloads_settled)

    # -- reading downloads
    call("tellStatus active A", "aria2.tellStatus", [G("A")])
    call("tellStatus A with keys", "aria2.tellStatus", [G("A"), ["gid", "status", "totalLength", "files"]])
    call("tellStatus A with an unknown key", "aria2.tellStatus", [G("A"), ["gid", "noSuchKey"]])
    call("tellStatus complete B", "aria2.tellStatus", [G("B")])
    call("tellStatus paused C", "aria2.tellStatus", [G("C")])
    call("tellStatus failed F", "aria2.tellStatus", [G("F")])
    call("tellStatus active G (mirrors)", "aria2.tellStatus", [G("G")])
    call("tellActive", "aria2.tellActive")
    call("tellActive AriaNg keys", "aria2.tellActive", [ARIANG_KEYS])
    call("tellWaiting", "aria2.tellWaiting", [0, 10])
    call("tellWaiting with keys", "aria2.tellWaiting", [0, 10, ["gid", "status"]])
    call("tellWaiting negative offset", "aria2.tellWaiting", [-1, 2, ["gid"]])
    call("tellWaiting offset past the end", "aria2.tellWaiting", [50, 10])
    call("tellStopped", "aria2.tellStopped", [0, 10])
    call("tellStopped with keys", "aria2.tellStopped", [0, 10, ARIANG_KEYS])
    call("getUris A", "aria2.getUris", [G("A")])
    call("getUris G (mirrors)", "aria2.getUris", [G("G")])
    call("getFiles A", "aria2.getFiles", [G("A")])
    call("getFiles paused C", "aria2.getFiles", [G("C")])
    call("getFiles complete B", "aria2.getFiles", [G("B")])
    call("getServers active A", "aria2.getServers", [G("A")])
    call("getServers paused C", "aria2.getServers", [G("C")])
    call("getPeers A", "aria2.getPeers", [G("A")])
    call("getGlobalStat", "aria2.getGlobalStat")

    # -- options
    call("getOption active A", "aria2.getOption", [G("A")], save="optionA")
    call("getOption paused C", "aria2.getOption", [G("C")], save="optionC")
    call("getOption paused D", "aria2.getOption", [G("D")], save="optionD")
    call("getOption complete B", "aria2.getOption", [G("B")])
    call("getOption unknown GID", "aria2.getOption", ["0123456789abcdef"])
    call("changeOption paused C whole getOption object", "aria2.changeOption",
         [G("C"), round_trip("optionC", {"max-download-limit": "200K"})])
    call("changeOption active A whole getOption object", "aria2.changeOption",
         [G("A"), round_trip("optionA", {"max-download-limit": "120K"})])
    call("changeOption paused D webui-aria2 gear dialog", "aria2.changeOption",
         [G("D"), webui_gear("optionD", active=False, change={"max-download-limit": "150K"})])
    call("changeOption active A webui-aria2 gear dialog", "aria2.changeOption",
         [G("A"), webui_gear("optionA", active=True, change={"max-download-limit": LIMIT})])
    call("changeOption AriaNg one key", "aria2.changeOption", [G("C"), {"max-download-limit": LIMIT}])
    call("changeOption AriaNg header array", "aria2.changeOption", [G("C"), {"header": ["X-One: 1", "X-Two: 2"]}])
    call("changeOption AriaNg empty split", "aria2.changeOption", [G("C"), {"split": ""}])
    call("changeOption malformed value", "aria2.changeOption", [G("C"), {"split": "x"}])
    call("changeOption unknown option name", "aria2.changeOption", [G("C"), {"no-such-option": "1"}])
    call("changeOption number value", "aria2.changeOption", [G("C"), {"max-tries": 4}])
    call("changeOption complete B", "aria2.changeOption", [G("B"), {"max-download-limit": "10K"}])
    call("changeOption unknown GID", "aria2.changeOption", ["0123456789abcdef", {"max-download-limit": "10K"}])
    call("changeOption options not an object", "aria2.changeOption", [G("C"), ["max-download-limit"]])
    call("getOption paused C after changes", "aria2.getOption", [G("C")])
    call("changeGlobalOption several keys", "aria2.changeGlobalOption",
         [{"max-concurrent-downloads": "5", "max-overall-download-limit": "0", "max-tries": "3"}])
    call("changeGlobalOption webui-aria2 changed key", "aria2.changeGlobalOption",
         [{"max-overall-download-limit": "20M"}])
    call("changeGlobalOption malformed value", "aria2.changeGlobalOption", [{"max-concurrent-downloads": "0"}])
    call("changeGlobalOption unknown option name", "aria2.changeGlobalOption", [{"no-such-option": "1"}])
    call("changeGlobalOption not an object", "aria2.changeGlobalOption", ["max-tries=3"])
    call("getGlobalOption after changes", "aria2.getGlobalOption")

    # -- the waiting queue: E (position 0), C, D
    call("changePosition POS_SET", "aria2.changePosition", [G("C"), 0, "POS_SET"])
    call("changePosition POS_CUR", "aria2.changePosition", [G("C"), 1, "POS_CUR"])
    call("changePosition POS_END", "aria2.changePosition", [G("C"), 0, "POS_END"])
    call("changePosition POS_CUR negative", "aria2.changePosition", [G("C"), -1, "POS_CUR"])
    call("changePosition bad how", "aria2.changePosition", [G("C"), 0, "POS_NOWHERE"])
    call("changePosition pos a string", "aria2.changePosition", [G("C"), "1", "POS_SET"])
    call("changePosition active A", "aria2.changePosition", [G("A"), 0, "POS_SET"])
    call("tellWaiting after moves", "aria2.tellWaiting", [0, 10, ["gid", "status"]])
    call("changeUri paused C add a mirror", "aria2.changeUri", [G("C"), 1, [], [f"{FAST}/{BIG}"]])
    call("changeUri paused C delete it", "aria2.changeUri", [G("C"), 1, [f"{FAST}/{BIG}"], [], 0])
    call("changeUri bad file index", "aria2.changeUri", [G("C"), 7, [], [f"{FAST}/{BIG}"]])

    # -- pause and resume
    call("pause active A", "aria2.pause", [G("A")])
    wait("A paused", has_status("A", ["paused"]))
    call("tellStatus paused A", "aria2.tellStatus", [G("A"), ["gid", "status", "completedLength", "bitfield"]])
    call("pause paused A", "aria2.pause", [G("A")])
    call("unpause A", "aria2.unpause", [G("A")])
    wait("A active", has_status("A", ["active"]))
    call("unpause active A", "aria2.unpause", [G("A")])
    call("forcePause G", "aria2.forcePause", [G("G")])
    wait("G paused", has_status("G", ["paused"]))
    call("pause complete B", "aria2.pause", [G("B")])
    call("pause unknown GID", "aria2.pause", ["0123456789abcdef"])
    call("pause a number", "aria2.pause", [12])
    call("pauseAll", "aria2.pauseAll")
    wait("A paused by pauseAll", has_status("A", ["paused"]))
    call("tellActive after pauseAll", "aria2.tellActive", [["gid"]])
    call("unpauseAll", "aria2.unpauseAll")
    wait("A and G active again", lambda s: has_status("A", ["active"])(s) and has_status("G", ["active"])(s))
    call("forcePauseAll", "aria2.forcePauseAll")
    wait("A and G paused by forcePauseAll", lambda s: has_status("A", ["paused"])(s) and has_status("G", ["paused"])(s))
    call("unpause G", "aria2.unpause", [G("G")])
    call("unpause A again", "aria2.unpause", [G("A")])
    wait("A and G active again", lambda s: has_status("A", ["active"])(s) and has_status("G", ["active"])(s))

    # -- removing
    call("remove paused C", "aria2.remove", [G("C")])
    call("forceRemove paused D", "aria2.forceRemove", [G("D")])
    call("remove active G", "aria2.remove", [G("G")])
    wait("G removed", has_status("G", ["removed"]))
    call("remove complete B", "aria2.remove", [G("B")])
    call("remove unknown GID", "aria2.remove", ["0123456789abcdef"])
    call("tellStatus removed C (was paused)", "aria2.tellStatus", [G("C")])
    call("tellStatus removed G (was active)", "aria2.tellStatus", [G("G")])
    call("tellStopped after removes", "aria2.tellStopped", [0, 10, ["gid", "status", "errorCode"]])
    call("getGlobalStat after removes", "aria2.getGlobalStat")
    call("removeDownloadResult G", "aria2.removeDownloadResult", [G("G")])
    call("removeDownloadResult active A", "aria2.removeDownloadResult", [G("A")])
    call("removeDownloadResult G again", "aria2.removeDownloadResult", [G("G")])
    call("removeDownloadResult removed C (was paused)", "aria2.removeDownloadResult", [G("C")])
    call("tellStatus purged G", "aria2.tellStatus", [G("G")])
    call("purgeDownloadResult", "aria2.purgeDownloadResult")
    call("tellStopped after purge", "aria2.tellStopped", [0, 10])
    call("getGlobalStat after purge", "aria2.getGlobalStat")
    call("saveSession", "aria2.saveSession")

    # -- system.multicall
    call("system.multicall", "system.multicall", [lambda s: [
        {"methodName": "aria2.getVersion", "params": [f"token:{s.secret}"]},
        {"methodName": "aria2.tellStatus", "params": [f"token:{s.secret}", s.gids["A"], ["gid", "status"]]},
        {"methodName": "aria2.noSuchMethod", "params": [f"token:{s.secret}"]},
        {"methodName": "aria2.tellStatus", "params": [f"token:{s.secret}", "0123456789abcdef"]},
        {"methodName": "aria2.getGlobalStat", "params": []},  # no token
    ]], token=False)
    call("system.multicall nested", "system.multicall",
         [[{"methodName": "system.multicall", "params": [[]]}]], token=False)
    call("system.multicall not structs", "system.multicall", [[1, "x"]], token=False)
    call("system.multicall no methodName", "system.multicall", [[{"params": []}]], token=False)
    call("system.multicall empty", "system.multicall", [[]], token=False)

    # -- envelope errors
    call("unknown method", "aria2.noSuchMethod")
    call("unknown method without prefix", "getVersion")
    call("tellStatus unknown GID", "aria2.tellStatus", ["0123456789abcdef"])
    call("tellStatus malformed GID", "aria2.tellStatus", ["xyz!"])
    call("tellStatus GID a number", "aria2.tellStatus", [123])
    call("tellStatus no GID", "aria2.tellStatus", [])
    call("tellWaiting strings", "aria2.tellWaiting", ["0", "10"])
    call("tellStatus keys not a list", "aria2.tellStatus", [G("A"), "gid"])
    call("missing token", "aria2.getVersion", token=False)
    call("missing token, a GID first", "aria2.tellStatus", [G("A")], token=False)
    raw("params an object", lambda s: json.dumps({"jsonrpc": "2.0", "id": "p", "method": "aria2.getVersion",
                                                  "params": {"token": f"token:{s.secret}"}}))
    raw("params a string", lambda s: json.dumps({"jsonrpc": "2.0", "id": "p", "method": "aria2.getVersion",
                                                  "params": f"token:{s.secret}"}))
    raw("no params at all", lambda s: json.dumps({"jsonrpc": "2.0", "id": "p", "method": "system.listMethods"}))
    raw("method missing", lambda s: json.dumps({"jsonrpc": "2.0", "id": "m", "params": []}))
    raw("method a number", lambda s: json.dumps({"jsonrpc": "2.0", "id": "m", "method": 5, "params": []}))
    raw("invalid JSON", lambda s: '{"jsonrpc": "2.0", "id": 1, "method": "aria2.getVersion", ')
    raw("body a number", lambda s: "42")
    raw("body a string", lambda s: '"aria2.getVersion"')
    raw("empty body", lambda s: "")
    raw("call without id", body_of(("aria2.getVersion", [], None)))
    raw("id an object", lambda s: json.dumps({"jsonrpc": "2.0", "id": {"a": 1}, "method": "aria2.getVersion",
                                              "params": [f"token:{s.secret}"]}))
    raw("id a number", body_of(("aria2.getVersion", [], 7)))
    raw("id null", lambda s: json.dumps({"jsonrpc": "2.0", "id": None, "method": "aria2.getVersion",
                                         "params": [f"token:{s.secret}"]}))
    raw("no jsonrpc member", lambda s: json.dumps({"id": "j", "method": "aria2.getVersion",
                                                   "params": [f"token:{s.secret}"]}))

    # -- batches over HTTP
    raw("batch", body_of(("aria2.getVersion", [], "b1"), ("aria2.tellStatus", [G("A"), ["gid", "status"]], "b2"),
                         ("aria2.getGlobalStat", [], "b3"), ("aria2.noSuchMethod", [], "b4"),
                         ("aria2.tellStatus", ["0123456789abcdef"], "b5"), ("aria2.getVersion", [], "b6", False),
                         batch=True))
    raw("batch with a call without id", body_of(("aria2.getVersion", [], "c1"), ("aria2.getVersion", [], None),
                                                batch=True))
    raw("batch with a non-object element", lambda s: json.dumps(
        [{"jsonrpc": "2.0", "id": "d1", "method": "aria2.getVersion", "params": [f"token:{s.secret}"]}, 5, "x"]))
    raw("empty batch", lambda s: "[]")
    raw("batch of one", body_of(("aria2.getGlobalStat", [], "e1"), batch=True))

    # -- WebSocket
    raw("ws call", body_of(("aria2.tellStatus", [G("A"), ["gid", "status"]], "w1")), via="ws")
    raw("ws tellActive", body_of(("aria2.tellActive", [], "w1a")), via="ws")
    raw("ws error", body_of(("aria2.tellStatus", ["0123456789abcdef"], "w2")), via="ws")
    raw("ws unknown method", body_of(("aria2.noSuchMethod", [], "w3")), via="ws")
    raw("ws batch", body_of(("aria2.getVersion", [], "w4"), ("aria2.getGlobalStat", [], "w5"),
                            ("aria2.noSuchMethod", [], "w6"), batch=True), via="ws")
    raw("ws invalid JSON", lambda s: "{not json", via="ws", timeout=4)
    raw("ws params an object", lambda s: json.dumps({"jsonrpc": "2.0", "id": "w7", "method": "aria2.getVersion",
                                                     "params": {}}), via="ws")
    raw("ws missing token", body_of(("aria2.getVersion", [], "w8", False)), via="ws")
    raw("ws system.multicall", lambda s: json.dumps({"jsonrpc": "2.0", "id": "w9", "method": "system.multicall",
                                                     "params": [[{"methodName": "aria2.getGlobalStat",
                                                                  "params": [f"token:{s.secret}"]}]]}), via="ws")
    raw("ws call without id", body_of(("aria2.getVersion", [], None)), via="ws", timeout=4)

    # -- GET and JSONP
    raw("GET tellStatus", None, method="GET", target=get_target("aria2.tellStatus", [G("A"), ["gid", "status"]], "g1"))
    raw("GET getVersion", None, method="GET", target=get_target("aria2.getVersion", [], "g2"))
    raw("GET unknown GID", None, method="GET", target=get_target("aria2.tellStatus", ["0123456789abcdef"], "g3"))
    raw("GET JSONP getGlobalStat", None, method="GET",
        target=get_target("aria2.getGlobalStat", [], "g4", callback="cb_1"))
    raw("GET JSONP error", None, method="GET",
        target=get_target("aria2.tellStatus", ["0123456789abcdef"], "g5", callback="cb_2"))
    raw("GET batch", None, method="GET", target=lambda s: "/jsonrpc?params=" + b64(
        [{"jsonrpc": "2.0", "id": "g6", "method": "aria2.getVersion", "params": [f"token:{s.secret}"]},
         {"jsonrpc": "2.0", "id": "g7", "method": "aria2.getGlobalStat", "params": [f"token:{s.secret}"]}]))
    raw("GET without params", None, method="GET", target=lambda s: "/jsonrpc?method=system.listMethods&id=g8")
    raw("GET params not base64", None, method="GET",
        target=lambda s: "/jsonrpc?method=aria2.getVersion&id=g9&params=%%%")
    raw("GET a method that changes (saveSession)", None, method="GET",
        target=get_target("aria2.saveSession", [], "g10"))
    raw("GET no query", None, method="GET", target=lambda s: "/jsonrpc")
    raw("OPTIONS preflight", None, method="OPTIONS", target=lambda s: "/jsonrpc",
        headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"})
    raw("POST to another path", lambda s: json.dumps({"jsonrpc": "2.0", "id": 1, "method": "aria2.getVersion",
                                                      "params": [f"token:{s.secret}"]}), target="/rpc")

    # -- a wrong token, once (Stitch slows the address down until a right token comes)
    call("wrong token", "aria2.getVersion", token="token:not-the-secret")
    call("right token after a wrong one", "aria2.getGlobalStat")

    # -- the end: forceShutdown, then shutdown on a fresh pair
    call("forceRemove active A", "aria2.forceRemove", [G("A")])
    wait("A removed", has_status("A", ["removed"]))
    action("notifications", compare_notifications)
    call("forceShutdown", "aria2.forceShutdown")
    action("exit after forceShutdown", check_exit)
    action("restart both", restart)
    call("addUri on the fresh pair", "aria2.addUri", [[f"{SLOW}/{BIG}"], {"out": "h.bin", "max-download-limit": LIMIT}],
         gid="H")
    wait("H active", has_status("H", ["active"]))
    raw("shutdown over the WebSocket", body_of(("aria2.shutdown", [], "s1")), via="ws", timeout=10)
    action("exit after shutdown", check_exit)


# ----------------------------------------------------------------------------------------------------------------
# Running


current_step = [""]  # the label of the step running, for the notifications' record


def run_step(step, servers):
    label = step["label"]
    answers = []
    for server in servers:
        if step["kind"] == "call":
            ident = step["ident"]
            body = json.dumps(envelope(step["method"], step["params"], ident, step["token"], server))
            answer = server.http("POST", "/jsonrpc", body.encode())
        else:
            target = resolve(step["target"], server) if callable(step["target"]) else step["target"]
            body = step["body"](server) if step["body"] else None
            if step["via"] == "ws":
                answer = server.ws_exchange(body, timeout=step["timeout"])
            else:
                answer = server.http(step["method"], target, body.encode() if body is not None else None,
                                     headers=step.get("headers"))
        answers.append(answer)
        body_json = answer["body"]
        if step["kind"] == "call" and isinstance(body_json, dict) and "result" in body_json:
            if step["gid"]:
                server.gids[step["gid"]] = body_json["result"]
            if step["save"]:
                server.saved[step["save"]] = body_json["result"]
        if verbose:
            print(f"  {server.name}: {answer['status']} {answer['raw'][:300]!r}")
    if step["kind"] == "call" and step["gid"]:
        missing = [s.name for s in servers if step["gid"] not in s.gids]
        if missing:
            raise RuntimeError(f"{label}: no GID from {missing}: {[a['raw'][:300] for a in answers]}")
    a, s = answers
    diffs = []
    if a["status"] != s["status"]:
        diffs.append(("http.status", f"aria2 {a['status']}, stitch {s['status']}"))
    if a["ctype"] != s["ctype"] and a["status"] is not None:
        diffs.append(("http.content-type", f"aria2 {a['ctype']!r}, stitch {s['ctype']!r}"))
    compare_envelope(a["body"], s["body"], "", diffs, servers[0], servers[1])
    return diffs


def compare_notifications(servers):
    """The notifications the listeners got: which (download, notification) pairs each server sent."""
    time.sleep(1)
    seen = []
    for server in servers:
        names = {gid: name for name, gid in server.gids.items()}
        pairs = {}
        for method, params, during in server.notes:
            gid = params[0].get("gid") if isinstance(params, list) and params and isinstance(params[0], dict) else None
            pairs.setdefault(f"{names.get(gid, '?')} {method}", during)
        seen.append(pairs)
    diffs = []
    for pair in sorted(set(seen[0]) - set(seen[1])):
        diffs.append((f"notification {pair}", f"sent by aria2 (first during {seen[0][pair]!r}), not by stitch"))
    for pair in sorted(set(seen[1]) - set(seen[0])):
        diffs.append((f"notification {pair}", f"sent by stitch (first during {seen[1][pair]!r}), not by aria2"))
    shapes = [[n for n in server.notes[:1]] for server in servers]
    if shapes[0] and shapes[1]:
        compare_shape({"params": shapes[0][0][1]}, {"params": shapes[1][0][1]}, "notification", diffs,
                      servers[0], servers[1])
    if verbose:
        for server, pairs in zip(servers, seen):
            print(f"  {server.name}: {sorted(pairs.items())}")
    return diffs


def check_exit(servers):
    diffs = []
    codes = []
    for server in servers:
        try:
            codes.append(server.proc.wait(30))
        except subprocess.TimeoutExpired:
            codes.append("still running after 30 s")
    if codes[0] != codes[1]:
        diffs.append(("exit", f"aria2c exited {codes[0]}, stitch serve {codes[1]}"))
    return diffs


def restart(servers):
    for server in servers:
        server.stop()
        server.log.close()
        fresh = os.path.join(server.work, "again")
        os.makedirs(fresh)
        server.dir = fresh
        server.log = open(os.path.join(server.work, "server-again.log"), "w+")
        server.port = None
        server.listener = None
        server.start()
    return []


def matches_intended(label, path):
    for (label_glob, path_glob), reason in INTENDED.items():
        if fnmatch.fnmatchcase(label, label_glob) and fnmatch.fnmatchcase(path, path_glob):
            return (label_glob, path_glob), reason
    return None, None


def main():
    for name, size in ((BIG, 64 << 20), (SMALL, 200_000)):
        path = os.path.join(www, name)
        if not os.path.exists(path) or os.path.getsize(path) != size:
            with open(path, "wb") as f:
                if name == BIG:
                    f.truncate(size)
                else:
                    f.write(hashlib.sha256(b"conformance").digest() * (size // 32) + b"\0" * (size % 32))
    if os.path.exists(os.path.join(www, MISSING)):
        os.remove(os.path.join(www, MISSING))
    version = subprocess.run([aria2c_bin, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    work = tempfile.mkdtemp(prefix="stitch-conformance-")
    secret = secrets.token_hex(16)
    servers = [Server("aria2", work, secret), Server("stitch", work, secret)]
    build_scenario()
    started = time.monotonic()
    compared = differing = unexpected = 0
    used = set()
    failure = None
    try:
        for server in servers:
            server.start()
            server.listen()
        time.sleep(0.3)
        for step in steps:
            label = step["label"]
            current_step[0] = label
            if step["kind"] == "wait":
                deadline = time.monotonic() + step["timeout"]
                for server in servers:
                    while not step["condition"](server):
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"timed out waiting for {label} on {server.name}")
                        time.sleep(0.1)
                continue
            if only and not fnmatch.fnmatchcase(label, only) and step["kind"] != "action":
                # still run it (state must progress), but print nothing for it
                run_step(step, servers)
                continue
            if verbose:
                print(f"== {label}")
            diffs = step["function"](servers) if step["kind"] == "action" else run_step(step, servers)
            compared += 1
            unique = []
            for d in diffs:
                if d not in unique:
                    unique.append(d)
            if unique:
                differing += 1
                print(f"{label}")
            for path, description in unique:
                key, reason = matches_intended(label, path)
                if key:
                    used.add(key)
                    print(f"    intended    {path}: {description}\n                ({reason})")
                else:
                    unexpected += 1
                    print(f"    UNEXPECTED  {path}: {description}")
    except Exception as error:  # noqa: BLE001 - reported, and the run fails
        failure = f"{type(error).__name__}: {error}"
    finally:
        for server in servers:
            server.stop()
    stale = [key for key in INTENDED if key not in used]
    if stale and not only:
        print("\nintended differences not seen this run (timing, or fixed — check intended.py):")
        for label_glob, path_glob in stale:
            print(f"    {label_glob} :: {path_glob}")
    elapsed = time.monotonic() - started
    print(f"\n{version} vs {os.path.basename(stitch_bin)} ({stitch_bin}); work folder {work}")
    print(f"calls compared: {compared}, answers differing: {differing}, unexpected differences: {unexpected}, "
          f"{elapsed:.0f} s")
    if failure:
        print(f"REPLAY FAILED: {failure}")
        for server in servers:
            server.log.flush()
            print(f"  ({server.name}'s log: {server.log.name})")
        sys.exit(1)
    if unexpected:
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

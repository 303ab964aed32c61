"""One round of bench/rpc.sh for one server (stitch serve or aria2c --enable-rpc), already listening on PORT:
adds DOWNLOADS downloads of URL (one connection each), measures their throughput unpolled for QUIET seconds,
then for DURATION seconds while wrk (-t2 -c100, bench/rpc.lua) alternates aria2.tellActive and
aria2.getGlobalStat and WS_CLIENTS WebSocket clients listen for notifications; prints one JSON line.

then again for DURATION seconds at a fixed offered load of FIXED_RPS (each of wrk's 100 connections waits before
each request: bench/rpc.lua's DELAY_MS).

python rpc_driver.py NAME PORT SECRET URL DOWNLOADS QUIET DURATION WS_CLIENTS LUA [FIXED_RPS]
"""
import json
import subprocess
import sys
import threading
import time
import urllib.request

import websocket

name, port, secret, url = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
downloads, quiet, duration, ws_clients, lua = (int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]),
                                                int(sys.argv[8]), sys.argv[9])
fixed_rps = float(sys.argv[10]) if len(sys.argv) > 10 else 1000.0
endpoint = f"http://127.0.0.1:{port}/jsonrpc"


def call(method, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": [f"token:{secret}", *params]})
    request = urllib.request.Request(endpoint, body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer["result"]


def completed():
    active = call("aria2.tellActive", ["gid", "completedLength"])
    return sum(int(d["completedLength"]) for d in active), len(active)


for index in range(downloads):
    call("aria2.addUri", [url], {"out": f"d{index}.bin", "split": "1", "max-connection-per-server": "1"})
deadline = time.monotonic() + 30
while completed()[1] < downloads and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep(2)  # past the first second of every connection (nginx's limit_rate starts there)

before, active = completed()
start = time.monotonic()
time.sleep(quiet)
after, _ = completed()
unpolled = (after - before) / (time.monotonic() - start)

received = [0] * ws_clients
stop = threading.Event()


def listen(slot):
    socket = websocket.create_connection(f"ws://127.0.0.1:{port}/jsonrpc", timeout=1)
    while not stop.is_set():
        try:
            if socket.recv():
                received[slot] += 1
        except websocket.WebSocketTimeoutException:
            continue
        except Exception:  # noqa: BLE001 - a closed socket ends this listener
            break
    socket.close()


listeners = [threading.Thread(target=listen, args=(slot,), daemon=True) for slot in range(ws_clients)]
for thread in listeners:
    thread.start()


def load(delay_ms):
    """wrk -t2 -c100 for DURATION seconds (each connection waiting delay_ms before each request when > 0);
    returns wrk's figures and the downloads' throughput meanwhile."""
    before, _ = completed()
    start = time.monotonic()
    wrk = subprocess.run(
        ["wrk", "-t2", "-c100", f"-d{int(duration)}s", "--latency", "-s", lua, f"http://127.0.0.1:{port}/jsonrpc"],
        capture_output=True, text=True,
        env={"TOKEN": secret, "DELAY_MS": str(delay_ms), "PATH": "/usr/bin:/bin"})
    after, still = completed()
    polled = (after - before) / (time.monotonic() - start)
    result = next((line for line in wrk.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        raise SystemExit(f"wrk printed no RESULT line:\n{wrk.stdout}\n{wrk.stderr}")
    fields = dict(item.split("=", 1) for item in result.split()[1:])
    return fields, polled, still


# Flat out, then at a fixed offered load (FIXED_RPS over the 100 connections), where latency is compared at the
# same load for both servers rather than at each one's own saturation.
flat, polled, still = load(0)
fixed, fixed_polled, fixed_still = load(max(1, round(100 * 1000 / fixed_rps)))
stop.set()
print(json.dumps({
    "server": name, "rps": float(flat["rps"]), "p50_ms": float(flat["p50"]), "p99_ms": float(flat["p99"]),
    "errors": int(flat["errors"]) + int(flat["socket_errors"]) + int(fixed["errors"]) + int(fixed["socket_errors"]),
    "active": active, "active_after": min(still, fixed_still),
    "unpolled_MiBps": unpolled / 2**20, "polled_MiBps": polled / 2**20, "ws_clients": ws_clients,
    "fixed_rps": float(fixed["rps"]), "fixed_p50_ms": float(fixed["p50"]), "fixed_p99_ms": float(fixed["p99"]),
    "fixed_polled_MiBps": fixed_polled / 2**20,
}))

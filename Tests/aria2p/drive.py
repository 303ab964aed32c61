"""aria2p, a client nobody here wrote, drives `stitch serve`: adds, lists, pauses, resumes, moves and removes
downloads, reads and changes options, listens to notifications over the WebSocket, and every result is asserted.

Run by scripts/aria2p.sh (which makes the virtual environment): python drive.py STITCH_BINARY NGINX_DIR
"""
import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

import aria2p

stitch, nginx_dir = sys.argv[1], sys.argv[2]
ports = dict(line.strip().split("=", 1) for line in open(os.path.join(nginx_dir, "ports.env")) if "=" in line)
www = ports["NGINX_WWW"]
fast = f"http://127.0.0.1:{ports['NGINX_HTTP_PORT']}"
slow = f"http://127.0.0.1:{ports['NGINX_SLOW_PORT']}"
checks = 0


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        raise AssertionError(what)


def publish(name, size, seed):
    data = hashlib.sha256(seed.to_bytes(8, "big")).digest() * (size // 32 + 1)
    data = data[:size]
    with open(os.path.join(www, name), "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def wait(what, condition, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


work = tempfile.mkdtemp(prefix="stitch-aria2p-")
folder = os.path.join(work, "dl")
secret = secrets.token_hex(16)
log = open(os.path.join(work, "serve.log"), "w+")
env = dict(os.environ, STITCH_RPC_SECRET=secret)
daemon = subprocess.Popen(
    [stitch, "serve", "--dir", folder, "--rpc-listen", "127.0.0.1:0", "-j", "1", "-c", "1"],
    stderr=log, env=env)
try:
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        log.seek(0)
        found = re.search(r" on 127\.0\.0\.1:(\d+)", log.read())
        port = int(found.group(1)) if found else None
        time.sleep(0.05)
    check(port, "stitch serve said where it listens")
    api = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=port, secret=secret))

    # A wrong secret is refused.
    wrong = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=port, secret="not-it"))
    try:
        wrong.get_stats()
        check(False, "a wrong secret was accepted")
    except aria2p.ClientException as error:
        check("Unauthorized" in str(error), f"wrong secret: {error}")

    # Notifications over the WebSocket, as aria2p listens to them.
    completed, started = [], []
    api.listen_to_notifications(
        threaded=True, on_download_start=lambda api, gid: started.append(gid),
        on_download_complete=lambda api, gid: completed.append(gid), timeout=1)
    time.sleep(0.5)  # aria2p opens its socket on its own thread; nothing tells when it is open

    digest = publish("aria2p-fast.bin", 1_500_000, 1)
    one = api.add_uris([f"{fast}/aria2p-fast.bin"], options={"out": "fast.bin"})
    wait("the first download", lambda: one.update() or one.is_complete)
    check(one.total_length == 1_500_000 and one.completed_length == 1_500_000, f"lengths {one.total_length}")
    with open(os.path.join(folder, "fast.bin"), "rb") as f:
        check(hashlib.sha256(f.read()).hexdigest() == digest, "fast.bin is byte-exact")
    check(one.name == "fast.bin", f"name {one.name}")
    wait("its notifications", lambda: one.gid in completed)
    check(one.gid in started, f"onDownloadStart for {one.gid}: {started}")

    # A queue that one download at a time drains (-j 1), from the throttled port so they stay active.
    publish("aria2p-slow.bin", 12 << 20, 2)
    queued = [api.add_uris([f"{slow}/aria2p-slow.bin"], options={"out": f"slow{i}.bin"}) for i in range(4)]
    wait("the first slow download to start", lambda: queued[0].update() or queued[0].is_active)
    listed = api.get_downloads()
    check([d.gid for d in listed] == [q.gid for q in queued] + [one.gid], f"listed {[d.gid for d in listed]}")
    check([d.status for d in listed] == ["active", "waiting", "waiting", "waiting", "complete"],
          f"statuses {[d.status for d in listed]}")
    check(api.get_stats().num_active == 1 and api.get_stats().num_waiting == 3, "stats")

    check(api.move_to_top(queued[3]) == 0, "move_to_top")
    check(api.move_down(queued[3]) == 1, "move_down")
    check(api.move_to_bottom(queued[1]) == 2, "move_to_bottom")
    waiting = [d["gid"] for d in api.client.tell_waiting(0, 10, keys=["gid"])]
    check(waiting == [queued[3].gid, queued[2].gid, queued[1].gid], f"waiting order {waiting}")

    wait("bytes of the first slow download", lambda: queued[0].update() or queued[0].completed_length > 0)
    check(api.pause([queued[0]]) == [True], "pause")
    wait("the pause", lambda: queued[0].update() or queued[0].is_paused)
    check(queued[0].completed_length > 0, "the paused download kept its bytes")
    check(api.resume([queued[0]]) == [True], "resume")
    wait("the resume", lambda: queued[0].update() or queued[0].status in ("waiting", "active"))

    check(api.remove([queued[2]]) == [True], "remove")
    check(queued[2].gid not in [d.gid for d in api.get_downloads()], "removed and its result purged")

    options = api.get_global_options()
    check(options.max_concurrent_downloads == 1, f"max-concurrent-downloads {options.max_concurrent_downloads}")
    check(api.set_global_options({"max-concurrent-downloads": "2"}), "set_global_options")
    check(api.get_global_options().max_concurrent_downloads == 2, "changed")
    check(api.set_options({"max-download-limit": "512K"}, [queued[1]]) == [True], "set_options")
    check(api.get_options([queued[1]])[0].get("max-download-limit") == str(512 << 10), "per-download limit")
    try:
        api.set_global_options({"no-such-option": "1"})
        check(False, "an unknown option was accepted")
    except aria2p.ClientException as error:
        check("no-such-option" in str(error), f"refused by name: {error}")

    check(api.remove_all(force=True), "remove_all")
    check(api.purge(), "purge")
    check(api.get_downloads() == [], f"empty: {api.get_downloads()}")
    api.stop_listening()
finally:
    daemon.send_signal(signal.SIGTERM)
    status = daemon.wait(60)
    log.seek(0)
    text = log.read()
check(status == 0, f"stitch serve exited {status}:\n{text}")

# WSS: the daemon with a certificate serves the WebSocket over TLS too (websocket-client, trusting it).
import ssl  # noqa: E402
import websocket  # noqa: E402

tls_log = open(os.path.join(work, "tls.log"), "w+")
tls = subprocess.Popen(
    [stitch, "serve", "--dir", os.path.join(work, "tls"), "--rpc-listen", "127.0.0.1:0",
     "--rpc-certificate", os.path.join(nginx_dir, "cert.pem"), "--rpc-private-key", os.path.join(nginx_dir, "key.pem")],
    stderr=tls_log, env=env)
try:
    tls_port = None
    deadline = time.monotonic() + 60
    while tls_port is None and time.monotonic() < deadline:
        tls_log.seek(0)
        found = re.search(r" on 127\.0\.0\.1:(\d+)", tls_log.read())
        tls_port = int(found.group(1)) if found else None
        time.sleep(0.05)
    socket = websocket.create_connection(
        f"wss://127.0.0.1:{tls_port}/jsonrpc", timeout=10,
        sslopt={"ca_certs": os.path.join(nginx_dir, "cert.pem"), "cert_reqs": ssl.CERT_REQUIRED})
    socket.send(json.dumps({"jsonrpc": "2.0", "id": "w", "method": "aria2.getVersion", "params": [f"token:{secret}"]}))
    answer = json.loads(socket.recv())
    check(answer.get("id") == "w" and "version" in answer.get("result", {}), f"WSS answer {answer}")
    socket.close()
finally:
    tls.send_signal(signal.SIGTERM)
    check(tls.wait(60) == 0, "the TLS daemon stopped cleanly")
print(f"aria2p {importlib.metadata.version('aria2p')} drove stitch serve (and WSS answered): {checks} checks passed")

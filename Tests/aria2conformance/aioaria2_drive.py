"""aioaria2, an async aria2 client nobody here wrote, drives `stitch serve` over the WebSocket (and HTTP): adds,
reads and changes options, pauses and resumes, moves, removes and purges, and receives the notifications;
every result is asserted.

Run by scripts/conformance.sh (which makes the virtual environment): python aioaria2_drive.py STITCH_BINARY NGINX_DIR
"""
import asyncio
import hashlib
import importlib.metadata
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

import aioaria2
from aioaria2.exceptions import Aria2rpcException

stitch, nginx_dir = sys.argv[1], sys.argv[2]
ports = dict(line.strip().split("=", 1) for line in open(os.path.join(nginx_dir, "ports.env")) if "=" in line)
www = ports["NGINX_WWW"]
fast = f"http://127.0.0.1:{ports['NGINX_HTTP_PORT']}"
slow = f"http://127.0.0.1:{ports['NGINX_SLOW_PORT']}"
checks = 0
GID = re.compile(r"^[0-9a-f]{16}$")


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        raise AssertionError(what)


def publish(name, size, seed):
    data = (hashlib.sha256(seed.to_bytes(8, "big")).digest() * (size // 32 + 1))[:size]
    with open(os.path.join(www, name), "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


async def wait(what, condition, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def drive(port, secret, folder):
    events = []  # (notification, gid)

    async def record(client, data):
        events.append((data["method"].removeprefix("aria2."), data["params"][0]["gid"]))

    def seen(method, gid):
        return (method, gid) in events

    ws = await aioaria2.Aria2WebsocketClient.new(f"ws://127.0.0.1:{port}/jsonrpc", token=secret)
    http = aioaria2.Aria2HttpClient(f"http://127.0.0.1:{port}/jsonrpc", token=secret)
    try:
        for register in (ws.onDownloadStart, ws.onDownloadPause, ws.onDownloadStop, ws.onDownloadComplete,
                         ws.onDownloadError):
            register(record)

        # -- the daemon
        version = await ws.getVersion()
        check(isinstance(version.get("version"), str) and isinstance(version.get("enabledFeatures"), list),
              f"getVersion {version}")
        session = await ws.getSessionInfo()
        check(isinstance(session.get("sessionId"), str), f"getSessionInfo {session}")
        methods = await ws.listMethods()
        check({"aria2.addUri", "aria2.tellStatus", "aria2.changeOption", "system.multicall"} <= set(methods),
              f"listMethods {methods}")
        notifications = await ws.listNotifications()
        check({"aria2.onDownloadStart", "aria2.onDownloadPause", "aria2.onDownloadStop", "aria2.onDownloadComplete",
               "aria2.onDownloadError"} <= set(notifications), f"listNotifications {notifications}")
        stat = await ws.getGlobalStat()
        check(all(isinstance(v, str) for v in stat.values()) and stat["numActive"] == "0", f"getGlobalStat {stat}")

        # -- a download that completes: onDownloadStart, onDownloadComplete, the bytes
        digest = publish("aioaria2-fast.bin", 1_200_000, 11)
        done = await ws.addUri([f"{fast}/aioaria2-fast.bin"], {"out": "fast.bin"})
        check(isinstance(done, str) and GID.match(done), f"addUri gave {done!r}")
        await wait("onDownloadComplete", lambda: seen("onDownloadComplete", done))
        check(seen("onDownloadStart", done), f"onDownloadStart before the completion: {events}")
        status = await ws.tellStatus(done)
        check(status["status"] == "complete" and status["totalLength"] == status["completedLength"] == "1200000",
              f"tellStatus {status}")
        check(status["files"][0]["path"] == os.path.join(folder, "fast.bin"), f"path {status['files'][0]['path']}")
        with open(os.path.join(folder, "fast.bin"), "rb") as f:
            check(hashlib.sha256(f.read()).hexdigest() == digest, "fast.bin is byte-exact")
        check(await ws.get_status(done) == "complete", "get_status")

        # -- an active download, held slow by its limit
        publish("aioaria2-slow.bin", 24 << 20, 12)
        active = await ws.addUri([f"{slow}/aioaria2-slow.bin"], {"out": "slow.bin", "max-download-limit": "200K"})
        await wait("onDownloadStart of the slow one", lambda: seen("onDownloadStart", active))
        await wait("bytes of the slow one", lambda: has_bytes(ws, active))
        status = await ws.tellStatus(active, ["gid", "status", "totalLength", "downloadSpeed"])
        check(set(status) == {"gid", "status", "totalLength", "downloadSpeed"}, f"keys filter {sorted(status)}")
        check(status["gid"] == active and status["status"] == "active", f"active {status}")

        # -- options: getOption / changeOption, getGlobalOption / changeGlobalOption
        options = await ws.getOption(active)
        check(all(isinstance(v, str) for v in options.values()), "getOption values are strings")
        check(options["max-download-limit"] == str(200 << 10), f"max-download-limit {options['max-download-limit']}")
        check(options["out"] == "slow.bin", f"out {options.get('out')}")
        check(await ws.changeOption(active, {"max-download-limit": "100K"}) == "OK", "changeOption")
        options = await ws.getOption(active)
        check(options["max-download-limit"] == str(100 << 10), f"changed to {options['max-download-limit']}")
        # the whole object back, as a settings dialog sends it
        whole = dict(options, **{"max-download-limit": "150K"})
        check(await ws.changeOption(active, whole) == "OK", "changeOption with the whole object")
        check((await ws.getOption(active))["max-download-limit"] == str(150 << 10), "whole object applied")
        glob = await ws.getGlobalOption()
        check(glob["max-concurrent-downloads"] == "5", f"max-concurrent-downloads {glob['max-concurrent-downloads']}")
        check(await ws.changeGlobalOption({"max-overall-download-limit": "10M", "max-concurrent-downloads": "4"})
              == "OK", "changeGlobalOption")
        glob = await ws.getGlobalOption()
        check(glob["max-overall-download-limit"] == str(10 << 20) and glob["max-concurrent-downloads"] == "4",
              f"global now {glob['max-overall-download-limit']} {glob['max-concurrent-downloads']}")
        check(await ws.changeGlobalOption({"max-overall-download-limit": "0", "max-concurrent-downloads": "5"})
              == "OK", "changeGlobalOption back")
        try:
            await ws.changeOption(active, {"split": "x"})
            check(False, "a malformed value was accepted")
        except Aria2rpcException as error:
            check("split" in str(error), f"malformed value refused: {error}")

        # -- pause and resume: onDownloadPause, then onDownloadStart again
        check(await ws.pause(active) == active, "pause")
        await wait("onDownloadPause", lambda: seen("onDownloadPause", active))
        check(await ws.get_status(active) == "paused", "paused")
        starts = events.count(("onDownloadStart", active))
        check(await ws.unpause(active) == active, "unpause")
        await wait("onDownloadStart after unpause", lambda: events.count(("onDownloadStart", active)) > starts)
        check(await ws.get_status(active) == "active", "active again")
        check(await ws.forcePause(active) == active, "forcePause")
        await wait("status paused", lambda: status_is(ws, active, "paused"))
        check(await ws.unpauseAll() == "OK", "unpauseAll")
        await wait("active after unpauseAll", lambda: status_is(ws, active, "active"))
        check(await ws.pauseAll() == "OK", "pauseAll")
        await wait("paused by pauseAll", lambda: status_is(ws, active, "paused"))
        check(await ws.forcePauseAll() == "OK", "forcePauseAll")
        check(await ws.unpauseAll() == "OK", "unpauseAll again")
        await wait("active after the second unpauseAll", lambda: status_is(ws, active, "active"))

        # -- the waiting queue
        queued = [await ws.addUri([f"{slow}/aioaria2-slow.bin"], {"out": f"q{i}.bin", "pause": "true"})
                  for i in range(3)]
        waiting = [d["gid"] for d in await ws.tellWaiting(0, 10, ["gid", "status"])]
        check(waiting == queued, f"tellWaiting {waiting}")
        check(await ws.changePosition(queued[2], 0, "POS_SET") == 0, "changePosition POS_SET")
        check(await ws.changePosition(queued[2], 1, "POS_CUR") == 1, "changePosition POS_CUR")
        check(await ws.changePosition(queued[0], 0, "POS_END") == 2, "changePosition POS_END")
        waiting = [d["gid"] for d in await ws.tellWaiting(0, 10, ["gid"])]
        check(waiting == [queued[2], queued[1], queued[0]], f"order {waiting}")
        statuses = [s async for s in ws.get_statuses(queued)]
        check(statuses == ["paused"] * 3, f"get_statuses {statuses}")
        results = await ws.multicall([{"methodName": "aria2.tellStatus", "params": [g, ["gid"]]} for g in queued])
        check([r[0]["gid"] for r in results] == queued, f"multicall {results}")

        # -- HTTP too, and its batch mode (queued calls sent together)
        actives = await http.tellActive(["gid", "status"])
        check([d["gid"] for d in actives] == [active], f"tellActive over HTTP {actives}")
        batch = aioaria2.Aria2HttpClient(f"http://127.0.0.1:{port}/jsonrpc", token=secret, mode="batch",
                                         client_session=http.client_session)
        for g in queued:
            await batch.tellStatus(g, ["gid", "status"])
        answers = await batch.process_queue()
        check([a["gid"] for a in answers] == queued and {a["status"] for a in answers} == {"paused"},
              f"batch mode {answers}")
        try:
            await http.tellStatus("0123456789abcdef")
            check(False, "an unknown GID was found")
        except Aria2rpcException as error:
            check("not found" in str(error), f"unknown GID: {error}")

        # -- a failing download: onDownloadError
        missing = await ws.addUri([f"{fast}/aioaria2-missing.bin"], {"out": "missing.bin"})
        await wait("onDownloadError", lambda: seen("onDownloadError", missing))
        status = await ws.tellStatus(missing, ["status", "errorCode", "errorMessage"])
        check(status["status"] == "error" and status["errorCode"] == "3", f"failed {status}")

        # -- remove: onDownloadStop; then the results go
        check(await ws.remove(active) == active, "remove")
        await wait("onDownloadStop", lambda: seen("onDownloadStop", active))
        check(await ws.get_status(active) == "removed", "removed")
        stopped = {d["gid"]: d["status"] for d in await ws.tellStopped(0, 10, ["gid", "status"])}
        check(stopped.get(active) == "removed" and stopped.get(done) == "complete" and stopped.get(missing) == "error",
              f"tellStopped {stopped}")
        check(await ws.removeDownloadResult(active) == "OK", "removeDownloadResult")
        check(active not in [d["gid"] for d in await ws.tellStopped(0, 10, ["gid"])], "its result is gone")
        for g in queued:
            check(await ws.forceRemove(g) == g, "forceRemove")
        check(await ws.purgeDownloadResult() == "OK", "purgeDownloadResult")
        check(await ws.tellStopped(0, 10) == [] and await ws.tellWaiting(0, 10) == [] and await ws.tellActive() == [],
              "nothing left")
        check(await ws.saveSession() == "OK", "saveSession")
        check(await ws.shutdown() == "OK", "shutdown")
    finally:
        await ws.close()
        await http.close()


async def has_bytes(client, gid):
    return int((await client.tellStatus(gid, ["completedLength"]))["completedLength"]) > 0


async def status_is(client, gid, wanted):
    return await client.get_status(gid) == wanted


def main():
    work = tempfile.mkdtemp(prefix="stitch-aioaria2-")
    folder = os.path.join(work, "dl")
    secret = secrets.token_hex(16)
    secret_file = os.path.join(work, "secret")
    with open(secret_file, "w") as f:
        f.write(secret + "\n")
    os.chmod(secret_file, 0o600)
    log = open(os.path.join(work, "serve.log"), "w+")
    env = {k: v for k, v in os.environ.items() if k != "STITCH_RPC_SECRET"}
    daemon = subprocess.Popen([stitch, "serve", "--dir", folder, "--rpc-listen", "127.0.0.1:0",
                               "--rpc-secret-file", secret_file], stderr=log, env=env)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and daemon.poll() is None:
            log.seek(0)
            found = re.search(r" on 127\.0\.0\.1:(\d+)", log.read())
            port = int(found.group(1)) if found else None
            time.sleep(0.05)
        check(port, "stitch serve said where it listens")
        asyncio.run(drive(port, secret, os.path.realpath(folder)))
        status = daemon.wait(30)  # aria2.shutdown stops it
        check(status == 0, f"stitch serve exited {status} after aria2.shutdown")
    except BaseException:
        log.seek(0)
        print(f"stitch serve's log:\n{log.read()[-4000:]}", file=sys.stderr)
        raise
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    print(f"aioaria2 {importlib.metadata.version('aioaria2')} drove stitch serve: {checks} checks passed")


if __name__ == "__main__":
    main()

"""What the web page costs the daemon, and how fast it draws: `stitch serve` with STOPPED stopped downloads and
ACTIVE slow active ones, measured for DURATION seconds with no page open and with PAGES pages open in headless
Chromium, in alternating rounds. Reports the daemon's CPU (% of one core), the bytes of one poll's answer, and
the page's time from navigation to its first full list. Run through bench/page.sh.
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

STITCH, NGINX_DIR = sys.argv[1], sys.argv[2]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
DURATION = float(os.environ.get("DURATION", "20"))
PAGES = int(os.environ.get("PAGES", "3"))
STOPPED = int(os.environ.get("STOPPED", "1000"))
ACTIVE = int(os.environ.get("ACTIVE", "5"))
PORTS = dict(line.strip().split("=", 1) for line in open(os.path.join(NGINX_DIR, "ports.env")) if "=" in line)
HTTP = f"http://127.0.0.1:{PORTS['NGINX_HTTP_PORT']}"
SLOW = f"http://127.0.0.1:{PORTS['NGINX_SLOW_PORT']}"

work = tempfile.mkdtemp(prefix="stitch-bench-page-")
log = open(os.path.join(work, "serve.log"), "w+")
daemon = subprocess.Popen([STITCH, "serve", "--dir", os.path.join(work, "dl"), "--rpc-listen", "127.0.0.1:0",
                           "-j", str(max(ACTIVE, 1))], stderr=log)


def rpc(method, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/jsonrpc", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,900",
                     "--disable-dev-shm-usage"]:
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


try:
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        log.seek(0)
        found = re.search(r" on 127\.0\.0\.1:(\d+)", log.read())
        port = int(found.group(1)) if found else None
        time.sleep(0.05)
    calls = [{"methodName": "aria2.addUri", "params": [[f"{HTTP}/missing-{i}.bin"]]} for i in range(STOPPED)]
    rpc("system.multicall", calls)
    while json.loads(rpc("aria2.getGlobalStat"))["result"]["numStopped"] != str(STOPPED):
        time.sleep(0.2)
    # Active downloads that last: the slow port, held to 64 KiB/s each.
    for i in range(ACTIVE):
        rpc("aria2.addUri", [f"{SLOW}/medium.bin?{i}"], {"out": f"active-{i}.bin", "max-download-limit": "64K"})
    keys = ["gid", "status", "totalLength", "completedLength", "downloadSpeed", "files", "errorMessage", "errorCode",
            "stitch.lastProblem"]
    poll = [{"methodName": "aria2.getGlobalStat", "params": []},
            {"methodName": "aria2.tellActive", "params": [keys]},
            {"methodName": "aria2.tellWaiting", "params": [0, 50, keys]},
            {"methodName": "aria2.tellStopped", "params": [-1, 50, keys]}]
    poll_bytes = len(rpc("system.multicall", poll))
    idle, opened, draw = [], [], []
    for round_ in range(ROUNDS):
        for mode in ("none", "pages"):
            drivers = []
            if mode == "pages":
                for _ in range(PAGES):
                    driver = browser()
                    started = time.monotonic()
                    driver.get(f"http://127.0.0.1:{port}/")
                    while driver.execute_script("return document.querySelectorAll('#list-stopped li').length") < 50:
                        time.sleep(0.02)
                    draw.append(time.monotonic() - started)
                    drivers.append(driver)
            before = cpu_seconds(daemon.pid)
            time.sleep(DURATION)
            used = (cpu_seconds(daemon.pid) - before) / DURATION * 100
            (opened if mode == "pages" else idle).append(used)
            for driver in drivers:
                driver.quit()

    def summary(values, unit):
        return f"median {statistics.median(values):.2f}{unit} (min {min(values):.2f}, max {max(values):.2f})"

    print(f"stitch serve with {STOPPED} stopped and {ACTIVE} active downloads, {ROUNDS} alternating rounds of "
          f"{DURATION:.0f} s:")
    print(f"  daemon CPU, no page open:      {summary(idle, '%')} of one core")
    print(f"  daemon CPU, {PAGES} pages open:     {summary(opened, '%')} of one core")
    print(f"  one poll's answer: {poll_bytes} bytes (the global numbers, the active, a page of waiting and of stopped)")
    print(f"  navigation to the first 50 stopped rows drawn: {summary(draw, ' s')}")
finally:
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(60)
    shutil.rmtree(work, ignore_errors=True)

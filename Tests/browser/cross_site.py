"""A web page of another site attacks a loopback `stitch serve` with no secret, in a real headless Chromium:
a <script> JSONP GET and an <img> GET of aria2.addUri, a JSONP read of aria2.tellActive, a no-cors POST of
aria2.addUri and a WebSocket. Every one must fail: nothing is added, nothing is read, and the daemon's log shows
that each request did arrive and was refused (so the test cannot pass because the browser sent nothing).

python cross_site.py STITCH_BINARY
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from attacker import serve_page

stitch = sys.argv[1]
work = tempfile.mkdtemp(prefix="stitch-browser-")
log_path = os.path.join(work, "serve.log")
log = open(log_path, "w+")
daemon = subprocess.Popen([stitch, "serve", "--dir", os.path.join(work, "dl"), "--rpc-listen", "127.0.0.1:0"],
                          stderr=log)
checks = 0


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        raise AssertionError(what)


def rpc(method, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/jsonrpc", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["result"]


try:
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        log.seek(0)
        found = re.search(r" on 127\.0\.0\.1:(\d+)", log.read())
        port = int(found.group(1)) if found else None
        time.sleep(0.05)
    check(port, "stitch serve started")
    daemon_url = f"http://127.0.0.1:{port}/jsonrpc"
    add = base64.b64encode(json.dumps([["http://127.0.0.1:9/evil.bin"]]).encode()).decode()
    page = f"""<!doctype html><html><head><title>attack</title></head><body>
<pre id="out">started</pre>
<script>
  const out = document.getElementById("out");
  function note(text) {{ out.textContent += "\\n" + text; }}
  function leaked(data) {{ note("LEAKED " + JSON.stringify(data)); }}
  function added(data) {{ note("ADDED " + JSON.stringify(data)); }}
</script>
<script src="{daemon_url}?method=aria2.addUri&id=1&params={add}&jsoncallback=added"
        onerror="note('jsonp-add blocked')"></script>
<script src="{daemon_url}?method=aria2.tellActive&id=2&jsoncallback=leaked"
        onerror="note('jsonp-read blocked')"></script>
<img src="{daemon_url}?method=aria2.addUri&id=3&params={add}" onerror="note('img blocked')">
<script>
  fetch("{daemon_url}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
        body: JSON.stringify({{jsonrpc: "2.0", id: 4, method: "aria2.addUri", params: [["http://127.0.0.1:9/evil2.bin"]]}})}})
    .then(() => note("post sent (opaque)"), () => note("post failed"));
  try {{
    const ws = new WebSocket("ws://127.0.0.1:{port}/jsonrpc");
    ws.onopen = () => {{ note("WS OPEN"); ws.send(JSON.stringify({{jsonrpc: "2.0", id: 5, method: "aria2.addUri", params: [["http://127.0.0.1:9/evil3.bin"]]}})); }};
    ws.onerror = () => note("ws blocked");
  }} catch (e) {{ note("ws threw"); }}
</script>
</body></html>"""

    attacker = serve_page(page)
    # "localhost" and "127.0.0.1" are different sites: the page is cross-site to the daemon, as evil.example is.
    page_url = f"http://localhost:{attacker.server_address[1]}/attack.html"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    check(chromium, "chromium is installed")
    profile = os.path.join(work, "profile")
    dom = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--virtual-time-budget=8000", "--dump-dom", page_url],
        capture_output=True, text=True, timeout=120).stdout
    attacker.shutdown()
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    notes = found.group(1) if found else ""
    check("started" in notes, f"the page ran its scripts:\n{dom}")
    check("LEAKED" not in notes and "ADDED" not in notes and "WS OPEN" not in notes, f"nothing got through:\n{notes}")
    check("jsonp-add blocked" in notes and "jsonp-read blocked" in notes, f"the JSONP scripts failed:\n{notes}")
    check(rpc("stitch.tellAll") == [], "no download was added")
    log.seek(0)
    text = log.read()
    check(text.count("Sec-Fetch-Site: cross-site") >= 3, f"the GETs arrived and were refused:\n{text}")
    check("requests from the page http://localhost:" in text, f"the POST and the WebSocket were refused:\n{text}")
finally:
    daemon.send_signal(signal.SIGTERM)
    status = daemon.wait(60)
    shutil.rmtree(work, ignore_errors=True)
check(status == 0, f"stitch serve exited {status}")
print(f"headless Chromium: a cross-site page's GET/JSONP/POST/WebSocket attacks on stitch serve all failed "
      f"({checks} checks)")

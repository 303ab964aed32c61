"""A loopback web server that serves one HTML page: the page of "another site" in the browser tests
(cross_site.py, page.py). Open it as http://localhost:PORT/ — localhost is a different site from the daemon's
127.0.0.1 or LAN name."""
import http.server
import threading


def serve_page(html):
    """Starts serving `html` for every GET on 127.0.0.1 and a free port; returns the server (`.server_address`,
    `.shutdown()`)."""
    body = html.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

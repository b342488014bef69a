"""A page of another origin, opened in the real browser (chromium headless),
cannot commit a turn in, or read a session of, a ``turnledger serve`` that
runs without a token on loopback: the attack of issue 24 (a "simple"
``text/plain`` POST from ``http://localhost:<other port>``), every way a page
can send it, and a cross-origin read."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from serve._harness import loopback, post_turn, running

pytestmark = [pytest.mark.loopback]

_ATTACK = """<!doctype html><html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="post" enctype="text/plain" target="sink"
      action="TARGET/v1/sessions/csrf-form/turns">
<input name='{"question": "planted by a form", "x": "' value='"}'>
</form>
<script>
const target = "TARGET";
const results = {};
async function attempt(name, run) {
  try { results[name] = await run(); } catch (e) { results[name] = "blocked: " + e.name; }
}
async function go() {
  document.getElementById("f").submit();
  await attempt("simple", async () => {
    await fetch(target + "/v1/sessions/csrf/turns", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: JSON.stringify({question: "planted"})});
    return "sent";
  });
  await attempt("json", async () => {
    const r = await fetch(target + "/v1/sessions/csrf-json/turns", {method: "POST",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({question: "planted"})});
    return "status " + r.status;
  });
  await attempt("read", async () => {
    const r = await fetch(target + "/v1/sessions/victim");
    return "read: " + await r.text();
  });
  await attempt("events", async () => {
    const r = await fetch(target + "/v1/sessions/victim/events");
    return "read: " + await r.text();
  });
  await new Promise(done => setTimeout(done, 500));  // the form's POST lands
  window.__results = results;
}
go();
</script></body></html>"""


@contextmanager
def _attacker(target: str) -> Iterator[str]:
    """A server on another port that serves the attack page; its URL uses
    the name ``localhost`` (the service is addressed as ``127.0.0.1``)."""
    page = _ATTACK.replace("TARGET", target).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _results(driver: Any, timeout: float = 20) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = driver.execute_script("return window.__results || null")
        if found is not None:
            return dict(found)
        time.sleep(0.1)
    raise AssertionError("the attack page did not finish")


def test_another_origin_can_neither_commit_a_turn_nor_read_a_session(
    browser: Any, tmp_path: Path
) -> None:
    db = tmp_path / "csrf.db"
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        with serve.client() as c:
            status, _ = post_turn(c, "victim", "the victim's secret question", rid="v1")
            assert status == 200
        with _attacker(serve.url) as page:
            browser.get(page)
            results = _results(browser)
        with serve.client() as c:
            for sid in ("csrf", "csrf-json", "csrf-form"):
                r = c.get(f"/v1/sessions/{sid}")
                assert r.status_code == 404, (sid, r.text)
            assert c.get("/v1/sessions").json()["total"] == 1
        log = [json.loads(x) for x in serve.log.read_text().splitlines() if x]
    assert "secret" not in json.dumps(results), results
    assert results["read"].startswith("blocked") and results["events"].startswith("blocked")
    assert results["json"].startswith("blocked")  # its preflight is not granted
    # The browser did send the simple and the form POSTs: the service refused them.
    access = [x for x in log if x.get("event") == "http_request"]
    attacks = [x for x in access if x["path"].startswith("/v1/sessions/csrf")]
    refused = {(x["path"], x["status"]) for x in attacks if x["method"] == "POST"}
    assert ("/v1/sessions/csrf/turns", 403) in refused, access
    assert ("/v1/sessions/csrf-form/turns", 403) in refused, access
    assert all(status >= 400 for _, status in refused)

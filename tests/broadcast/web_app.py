"""A FastAPI app serving a page that subscribes with the JS helper and plain EventSource,
and the broadcast endpoint mounted at /broadcast (run by uvicorn in the browser test)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from tests.broadcast.bc_app import app as tidings_app
from tidings.broadcasting.sse import broadcast_app

web = FastAPI()
web.mount("/broadcast", broadcast_app(tidings_app))

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>tidings broadcast</title>
<script src="/broadcast/tidings-broadcast.js"></script>
<style>body{font-family:sans-serif;margin:2em} li{padding:.3em;background:#eef;margin:.2em}</style>
</head><body>
<h1>Notifications</h1>
<p id="state">connecting</p>
<ul id="helper"></ul>
<ul id="plain"></ul>
<script>
  function add(list, text) {
    var li = document.createElement("li"); li.textContent = text;
    document.getElementById(list).appendChild(li);
  }
  // the optional helper: private channel of user 7 (the cookie is the test's "session")
  TidingsBroadcast.subscribe("/broadcast", ["private-User.7"], {
    notification: function (data, msg) { add("helper", data.text + " on " + msg.channel); },
  });
  // plain EventSource, nothing of ours
  var es = new EventSource("/broadcast?channel=news");
  es.onopen = function () { document.getElementById("state").textContent = "connected"; };
  es.addEventListener("news.posted", function (e) { add("plain", JSON.parse(e.data).data.text); });
</script>
</body></html>"""


@web.get("/")
def page() -> HTMLResponse:
    return HTMLResponse(PAGE)

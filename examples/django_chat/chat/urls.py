"""The one page: a text box and the room's lines (plain JavaScript, no build step)."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

PAGE = """<!doctype html>
<title>chat</title>
<ul id="lines"></ul>
<input id="line" autofocus placeholder="say something, press Enter">
<script>
  const room = location.hash.slice(1) || "lobby";
  const socket = new WebSocket(`ws://${location.host}/ws/chat/${room}/`);
  socket.onmessage = (e) => {
    const item = document.createElement("li");
    item.textContent = e.data;
    document.getElementById("lines").append(item);
  };
  document.getElementById("line").onkeydown = (e) => {
    if (e.key === "Enter" && e.target.value) { socket.send(e.target.value); e.target.value = ""; }
  };
</script>
"""


def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(PAGE)


urlpatterns = [path("", page)]

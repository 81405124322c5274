"""The OpenAPI 3.1 description of ``/api/v1``, read from the application's own routes.

Each operation is described by its handler's docstring (summary: its first line), its
path parameters, the paging parameters of a list, and the error reply every operation
may give; ``docs/http-api.md`` tells the bodies and the replies in full. Built once, when
the application is, so the description cannot drift from the routes served.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Final

from aiohttp import web

from router import __version__

PAGED: Final = frozenset(
    {"/api/v1/clients", "/api/v1/subscriptions", "/api/v1/retained", "/api/v1/bans"}
)
_PARAMETER = re.compile(r"{(\w+)}")
ERROR: Final = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "the router's error type"},
        "message": {"type": "string"},
    },
}


def _operation(path: str, method: str, handler: Any) -> dict[str, Any]:
    doc = inspect.getdoc(handler) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ") or f"{method.upper()} {path}"
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAMETER.findall(path)
    ]
    if path in PAGED and method == "get":
        for name, kind in (("limit", "integer"), ("cursor", "string")):
            parameters.append({"name": name, "in": "query", "schema": {"type": kind}})
    error = {"$ref": "#/components/responses/Error"}
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "JSON", "content": {"application/json": {}}},
            "400": error,
            "401": error,
            "403": error,
        },
    }
    if method != "get":
        operation["responses"]["409"] = error
    operation["responses"]["503"] = error
    if parameters:
        operation["parameters"] = parameters
    if method in ("post", "put", "delete") and path != "/api/v1/logout":
        operation["requestBody"] = {"required": False, "content": {"application/json": {}}}
        operation["responses"]["413"] = error
    if path == "/api/v1/login":
        operation["responses"]["429"] = error
    return operation


def openapi_document(app: web.Application) -> dict[str, Any]:
    """The description of every ``/api/v1`` route of ``app``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        method = route.method.lower()
        if not path or not path.startswith("/api/v1/") or method == "head":
            continue
        paths.setdefault(path, {})[method] = _operation(path, method, route.handler)
    return {
        "openapi": "3.1.0",
        "info": {"title": "router HTTP API", "version": __version__},
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": {"Error": ERROR},
            "responses": {
                "Error": {
                    "description": "an error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": "router_session"},
                "apiKey": {"type": "http", "scheme": "bearer"},
            },
        },
        "security": [{"session": []}, {"apiKey": []}],
    }

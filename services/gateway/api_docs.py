"""The API's documents: the OpenAPI document (`openapi.json`, shipped in the package) and the
`/docs` page, an HTML rendering of it made on the server with no script and no remote asset, so
it works offline."""

from __future__ import annotations

import functools
import html
import json
import os
from typing import Any

from aiohttp import web

OPENAPI_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openapi.json")
_REF_PREFIX = "#/components/schemas/"
_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #222; }
code, .type { font-family: ui-monospace, monospace; font-size: 90%; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
.route { border: 1px solid #ddd; border-radius: 6px; padding: .5em 1em; margin: 1em 0; }
.method { display: inline-block; min-width: 4em; font-weight: bold; color: #fff; background: #49c;
          border-radius: 4px; text-align: center; margin-right: .5em; }
.method.post { background: #4a4; }
.lock { color: #a60; font-size: 85%; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
.desc { white-space: pre-wrap; }
"""


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3 document of this API (read once)."""
    with open(OPENAPI_PATH, encoding="utf-8") as f:
        return json.load(f)


@functools.cache
def docs_page() -> str:
    """The whole document as one self-contained HTML page."""
    doc = openapi_document()
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{_e(doc['info']['title'])} API</title>",
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>{_e(doc['info']['title'])} API <small>{_e(doc['info']['version'])}</small></h1>",
             f"<p class='desc'>{_e(doc['info'].get('description', ''))}</p>",
             "<p>The machine-readable document: <a href='/api-doc/openapi.json'>/api-doc/openapi.json</a>. "
             "<span class='lock'>&#128274;</span> marks routes that need "
             "<code>Authorization: Bearer &lt;key&gt;</code> "
             "when the server has an API key.</p><h2>Routes</h2>"]
    for path, operations in doc["paths"].items():
        parts.extend(_route_html(path, method, op) for method, op in operations.items())
    parts.append("<h2>Schemas</h2>")
    parts.extend(_schema_html(name, schema) for name, schema in doc["components"]["schemas"].items())
    parts.append("</body></html>")
    return "".join(parts)


async def openapi_json(request: web.Request) -> web.Response:
    """GET /api-doc/openapi.json."""
    return web.json_response(openapi_document())


async def docs(request: web.Request) -> web.Response:
    """GET /docs: the API page."""
    return web.Response(text=docs_page(), content_type="text/html")


# -- rendering ---------------------------------------------------------------------------------

def _e(text: Any) -> str:
    return html.escape(str(text))


def _route_html(path: str, method: str, op: dict[str, Any]) -> str:
    lock = " <span class='lock' title='API key'>&#128274;</span>" if op.get("security") else ""
    rows = [f"<div class='route' id='{_e(op.get('operationId', path))}'>",
            f"<p><span class='method {method}'>{method.upper()}</span><code>{_e(path)}</code>{lock} "
            f"&mdash; {_e(op.get('summary', ''))}</p>"]
    body = op.get("requestBody", {}).get("content", {})
    if body:
        rows.append("<p>Body: " + ", ".join(f"<code>{_e(kind)}</code> {_type_html(media['schema'])}"
                                            for kind, media in body.items()) + "</p>")
    rows.append("<table><tr><th>status</th><th>meaning</th><th>content</th></tr>")
    for status, response in op.get("responses", {}).items():
        content = ", ".join(f"<code>{_e(kind)}</code> {_type_html(media.get('schema', {}))}"
                            for kind, media in response.get("content", {}).items())
        rows.append(f"<tr><td>{_e(status)}</td><td>{_e(response.get('description', ''))}</td><td>{content}</td></tr>")
    rows.append("</table></div>")
    return "".join(rows)


def _schema_html(name: str, schema: dict[str, Any]) -> str:
    rows = [f"<h3 id='schema-{_e(name)}'>{_e(name)}</h3>"]
    if schema.get("description"):
        rows.append(f"<p class='desc'>{_e(schema['description'])}</p>")
    properties = schema.get("properties")
    if not properties:
        rows.append(f"<p class='type'>{_type_html(schema)}</p>")
        return "".join(rows)
    required = set(schema.get("required", []))
    rows.append("<table><tr><th>field</th><th>type</th><th>required</th><th>description</th></tr>")
    for field, prop in properties.items():
        rows.append(f"<tr><td><code>{_e(field)}</code></td><td class='type'>{_type_html(prop)}</td>"
                    f"<td>{'yes' if field in required else ''}</td>"
                    f"<td class='desc'>{_e(prop.get('description', ''))}{_limits(prop)}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _type_html(schema: dict[str, Any]) -> str:
    """A schema as a short type expression, with links to named schemas."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(_REF_PREFIX)
        kind = f"<a href='#schema-{_e(name)}'>{_e(name)}</a>"
    elif alternatives := schema.get("oneOf") or schema.get("anyOf") or schema.get("allOf"):
        kind = " | ".join(_type_html(s) for s in alternatives)
    elif schema.get("type") == "array":
        kind = f"array of {_type_html(schema.get('items', {}))}"
    elif "enum" in schema:
        kind = " | ".join("null" if v is None else f"&quot;{_e(v)}&quot;" for v in schema["enum"])
    else:
        kind = _e(schema.get("type", "any"))
    return kind + (" | null" if schema.get("nullable") else "")


def _limits(prop: dict[str, Any]) -> str:
    notes = []
    if "minimum" in prop:
        notes.append(f"{'&gt;' if prop.get('exclusiveMinimum') else '&ge;'} {_e(prop['minimum'])}")
    if "maximum" in prop:
        notes.append(f"{'&lt;' if prop.get('exclusiveMaximum') else '&le;'} {_e(prop['maximum'])}")
    if "default" in prop:
        notes.append(f"default {_e(json.dumps(prop['default']))}")
    return f" <small>({', '.join(notes)})</small>" if notes else ""

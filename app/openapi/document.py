"""The OpenAPI document: FastAPI's, completed from the routes themselves.

Every operation documents the errors it can answer with, found in one place (`error_statuses`):
those its shape implies (validation, a path id that may not exist, the middleware's limits),
those its dependencies raise (authentication, roles, CSRF) and those its endpoint declares
with `app.errors.raises`. Create operations link to the operations on what they created.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts

from app.api_errors import ERROR_RESPONSES, ErrorOut
from app.errors import DomainError, declared_errors
from app.fields import NO_NUL_PATTERN
from app.openapi.marks import SECURITY_SCHEMES
from app.route_table import Route, RouteTable

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}
FORBIDDEN_STATUS = 403
# Any request may meet these before it reaches a route (app.middleware).
MIDDLEWARE_STATUSES = {400}  # a NUL byte in the URL
BODY_LIMIT_STATUS = 413
BODY_TIMEOUT_STATUS = 408  # a body that does not arrive in time (app/middleware.py)
THROTTLED_STATUS = 429  # refusals past the user's or the address's budget (app/audit/refusals.py)


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for sub in dependant.dependencies:
        yield sub
        yield from _dependencies(sub)


def api_routes(app: FastAPI) -> list[RouteContext]:
    """Every documented route, with the prefixes and dependencies of the routers it came by."""
    return [
        context
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIRoute) and context.include_in_schema
    ]


def _route(route: RouteContext) -> Route:
    return (str(route.path_format), route.path_regex, frozenset(route.methods or ()))


def route_methods(app: FastAPI) -> RouteTable:
    """The documented routes with the methods each offers."""
    return RouteTable(_route(route) for route in api_routes(app))


def signed_in_routes(app: FastAPI) -> RouteTable:
    """The documented routes with the methods that answer only a signed-in caller."""
    signed_in: dict[str, list[str]] = {"bearer": []}
    return RouteTable(_route(route) for route in api_routes(app) if signed_in in security_of(route))


def _calls(route: RouteContext) -> Iterator[Callable[..., Any]]:
    if route.endpoint is not None:
        yield route.endpoint
    for sub in _dependencies(route.dependant):
        if sub.call is not None:
            yield sub.call


def security_of(route: RouteContext) -> list[dict[str, list[str]]]:
    """The security requirement of the route: that of its innermost authenticating dependency."""
    found: list[dict[str, list[str]]] = []
    for call in _calls(route):
        found = getattr(call, "__security__", found)
    return found


def error_statuses(route: RouteContext, method: str) -> set[int]:
    """Every error status `method` on `route` can answer with."""
    unsafe = method not in SAFE_METHODS
    dependant = route.dependant
    statuses = set(MIDDLEWARE_STATUSES)
    has_params = bool(
        dependant.path_params
        or dependant.query_params
        or dependant.header_params
        or dependant.cookie_params
        or route.body_field
    )
    for sub in _dependencies(dependant):
        has_params |= bool(sub.path_params or sub.query_params or sub.header_params)
    if has_params:
        statuses.add(422)
    if route.body_field is not None or (route.openapi_extra or {}).get("requestBody"):
        statuses.update((BODY_LIMIT_STATUS, BODY_TIMEOUT_STATUS))
    if "{" in str(route.path_format):
        statuses.add(404)  # every path id names something that may be missing or not the caller's
        statuses.add(THROTTLED_STATUS)  # ... and a scan of such ids is throttled
    gates = set()
    for call in _calls(route):
        errors: tuple[type[DomainError], ...] = declared_errors(call, unsafe=unsafe)
        statuses.update(error.status for error in errors)
        if hasattr(call, "__second_factor_gate__"):
            gates.add(bool(call.__second_factor_gate__))
    if True in gates and False not in gates:
        statuses.add(FORBIDDEN_STATUS)  # app.deps.ENROL_FIRST
    return statuses


def _shared_error_responses() -> dict[str, Any]:
    return {
        name: {"description": meaning, "content": {"application/json": {"schema": ERROR_REF}}}
        for name, meaning in ERROR_RESPONSES.values()
    }


def _response_schema_name(response: dict[str, Any]) -> str | None:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[1] if ref else None


def _add_links(document: dict[str, Any], routes: list[tuple[RouteContext, str]]) -> None:
    """Link each create operation (a POST answering 201 or 202) to the operations on its result.

    A created thing's `id` fills the first path parameter of operations under the collection it
    was created in (POST /users -> /users/{user_id}, POST /workspaces/{ws}/jobs -> /jobs/{job_id});
    a thing without an `id` is named by the field of the parameter's name (`serial`).
    """
    components = document["components"]["schemas"]
    paths = [(str(route.path_format), method) for route, method in routes]
    operations = [(path, method, document["paths"][path][method.lower()]) for path, method in paths]
    for path, method, operation in operations:
        created = next((s for s in ("201", "202") if s in operation["responses"]), None)
        if method != "POST" or created is None:
            continue
        response = operation["responses"][created]
        name = _response_schema_name(response)
        if name is None:
            continue
        fields = set(components[name].get("properties", {}))
        collection = path.rstrip("/").rsplit("/", 1)[1]
        own_params = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        links: dict[str, Any] = {}
        for target_path, _method, target in operations:
            if target is operation:
                continue
            params = [p["name"] for p in target.get("parameters", []) if p["in"] == "path"]
            if not params:
                continue
            values: dict[str, str] = {}
            under_collection = target_path.split("{", 1)[0].rstrip("/").endswith("/" + collection)
            for index, param in enumerate(params):
                if index == 0 and under_collection and "id" in fields:
                    values[param] = "$response.body#/id"
                elif param in fields and "id" not in fields:
                    values[param] = f"$response.body#/{param}"
                elif param in own_params:
                    values[param] = f"$request.path.{param}"
            if len(values) == len(params) and any(
                v.startswith("$response") for v in values.values()
            ):
                links[target["operationId"]] = {
                    "operationId": target["operationId"],
                    "parameters": values,
                }
        if links:
            response["links"] = links


def _string_schemas(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if schema.get("type") == "string":
        yield schema
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            yield from _string_schemas(sub)
    for sub in schema.get("properties", {}).values():
        yield from _string_schemas(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _string_schemas(schema[key])


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if "$ref" in schema:
            yield schema["$ref"].rsplit("/", 1)[1]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def _forbid_nul(document: dict[str, Any]) -> None:
    """State on every string a request carries that it holds no NUL: the URL middleware refuses
    one (400) and every body model does (422), since PostgreSQL text cannot store it."""
    components = document["components"]["schemas"]
    bodies: list[dict[str, Any]] = []
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                bodies.append(parameter["schema"])
            for content in operation.get("requestBody", {}).get("content", {}).values():
                bodies.append(content.get("schema", {}))
    pending = [name for body in bodies for name in _refs(body)]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            bodies.append(components[name])
            pending.extend(_refs(components[name]))
    for body in bodies:
        for string in _string_schemas(body):
            if not {"pattern", "enum", "const"} & set(string) and string.get("format") != "binary":
                string["pattern"] = NO_NUL_PATTERN


def build_document(app: FastAPI) -> dict[str, Any]:
    """The whole OpenAPI document of `app`."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error_schema = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorOut"] = error_schema
    components["securitySchemes"] = SECURITY_SCHEMES
    components["responses"] = _shared_error_responses()

    routes = [
        (route, method) for route in api_routes(app) for method in sorted(route.methods or ())
    ]
    for route, method in routes:
        operation = document["paths"][str(route.path_format)][method.lower()]
        responses = operation["responses"]
        for status in sorted(error_statuses(route, method)):
            # replaces FastAPI's own 422, whose list-shaped detail this API never sends; a
            # status without a shared response in ERROR_RESPONSES fails here, at the first build
            responses[str(status)] = {
                "$ref": f"#/components/responses/{ERROR_RESPONSES[status][0]}"
            }
        requirement = security_of(route)
        if requirement:
            operation["security"] = requirement
    _add_links(document, routes)
    _forbid_nul(document)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


def install_document(app: FastAPI) -> None:
    """Serve `build_document` (built once, on first request) at the app's openapi_url."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

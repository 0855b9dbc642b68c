"""Which methods the documented routes offer on a path, found without trying every route.

Two middlewares ask this of every request (app/middleware.py, for 405; app/credential_gate.py,
for routes that answer only a signed-in caller). Trying each route's pattern in turn costs a
hundred regex matches a request. Here the routes are filed under the first three segments of
their path (`/api/v1/jobs`), which a route with no parameter there can only match literally,
so a request's path is tried against the few routes under its own prefix, and against the
routes with a parameter in their first three segments (none today), which any path may match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# (path format as declared, e.g. "/api/jobs/{job_id}"; its compiled pattern; its methods)
Route = tuple[str, re.Pattern[str], frozenset[str]]


def _prefix(path: str) -> str:
    """The first three segments of `path`: "/api/v1/jobs" of "/api/v1/jobs/7/events"."""
    return "/".join(path.split("/", 4)[:4])


class RouteTable:
    """Routes filed by path prefix; `methods(path)` is the union over every route that matches."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self._by_prefix: dict[str, list[tuple[re.Pattern[str], frozenset[str]]]] = {}
        self._anywhere: list[tuple[re.Pattern[str], frozenset[str]]] = []
        for path_format, pattern, methods in routes:
            prefix = _prefix(path_format)
            if "{" in prefix:
                self._anywhere.append((pattern, methods))
            else:
                self._by_prefix.setdefault(prefix, []).append((pattern, methods))

    def _candidates(self, path: str) -> Iterable[tuple[re.Pattern[str], frozenset[str]]]:
        yield from self._by_prefix.get(_prefix(path), ())
        yield from self._anywhere

    def methods(self, path: str) -> frozenset[str]:
        """The methods offered on `path` (empty: no route has this path)."""
        allowed: set[str] = set()
        for pattern, methods in self._candidates(path):
            if pattern.match(path):
                allowed |= methods
        return frozenset(allowed)

    def offers(self, method: str, path: str) -> bool:
        """Whether some route answers `method` on `path`."""
        return any(
            method in methods and pattern.match(path) for pattern, methods in self._candidates(path)
        )

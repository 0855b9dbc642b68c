"""The route look-ups every request pays: the 405 check and the credential gate's signed-in check.

Both ask which methods the documented routes offer on the request's path. The baseline tries
every route's pattern in turn, as both did before app/route_table.py; the table tries the
routes under the path's first three segments. Both run on the app's own routes, on the paths
of every route (ids filled in), in interleaved rounds in this one process and thread; the
ratio is taken within each round. The floor is one regex match per route under the path's
prefix (`routes_under_a_paths_prefix_mean`; the workspaces' prefix holds the most).

Prints a table, writes bench/results/route_lookup.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.main import create_app
from app.openapi.document import api_routes, route_methods, security_of, signed_in_routes
from app.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results" / "route_lookup.json"
Routes = list[tuple[re.Pattern[str], frozenset[str]]]


def every_route(every: Routes, signed_in: Routes, method: str, path: str) -> bool:
    """The baseline, both scans as they were: the 405 check's union over every route, then
    the gate's first signed-in route with the method."""
    allowed: set[str] = set()
    for pattern, methods in every:
        if pattern.match(path):
            allowed |= methods
    return method in allowed and any(p.match(path) and method in m for p, m in signed_in)


def per_request_ns(lookup: Callable[[str, str], bool], requests: list[tuple[str, str]]) -> float:
    start = time.perf_counter_ns()
    for method, path in requests:
        lookup(method, path)
    return (time.perf_counter_ns() - start) / len(requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50, help="passes over the paths per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nebula-routes-") as tmp:
        settings = Settings(
            var_dir=Path(tmp) / "var",
            database_url=f"sqlite:///{tmp}/nebula.db",
            secret_key="bench-secret-key-not-for-production",  # type: ignore[arg-type]
            run_reaper=False,
        )
        app = create_app(settings)
    contexts = api_routes(app)
    every: Routes = [(r.path_regex, frozenset(r.methods or ())) for r in contexts]
    signed: Routes = [
        (r.path_regex, frozenset(r.methods or ()))
        for r in contexts
        if {"bearer": []} in security_of(r)
    ]
    allowed, gate = route_methods(app), signed_in_routes(app)
    uuid = "3f2b8c1e-5d4a-4e6b-9a7c-2d1e0f9b8a76"
    requests = [
        (method, re.sub(r"\{[^}]*\}", uuid, str(r.path_format)))
        for r in contexts
        for method in sorted(r.methods or ())
    ] * args.repeat

    def baseline(method: str, path: str) -> bool:
        return every_route(every, signed, method, path)

    def table(method: str, path: str) -> bool:
        return method in allowed.methods(path) and gate.offers(method, path)

    def under_prefix(path: str) -> int:
        prefix = "/".join(path.split("/", 4)[:4])
        return sum(str(r.path_format).startswith(prefix) for r in contexts)

    rounds: dict[str, list[float]] = {"every_route": [], "table": []}
    console = Console()
    with Progress(console=console) as progress:
        task = progress.add_task("route look-ups", total=args.rounds * 2)
        for _ in range(args.rounds):
            for name, lookup in (("every_route", baseline), ("table", table)):
                rounds[name].append(per_request_ns(lookup, requests))
                progress.advance(task)
    ratios = [t / b for t, b in zip(rounds["table"], rounds["every_route"], strict=True)]
    result: dict[str, Any] = {
        "routes": len(every),
        "signed_in_routes": len(signed),
        "requests_per_round": len(requests),
        "routes_under_a_paths_prefix_mean": round(
            statistics.mean(under_prefix(path) for _, path in requests), 1
        ),
        "rounds": args.rounds,
    }
    out = Table(title=f"route look-ups per request, {len(every)} routes, {args.rounds} rounds")
    for column in ("look-up", "µs per request (min-max)"):
        out.add_column(column, justify="right")
    for name, values in rounds.items():
        us = [v / 1000 for v in values]
        result[f"{name}_us"] = round(statistics.median(us), 2)
        result[f"{name}_us_min"] = round(min(us), 2)
        result[f"{name}_us_max"] = round(max(us), 2)
        out.add_row(name, f"{statistics.median(us):.1f} ({min(us):.1f}-{max(us):.1f})")
    result["table_vs_every_route"] = round(statistics.median(ratios), 3)
    result["table_vs_every_route_rounds"] = [round(r, 3) for r in ratios]
    console.print(out)
    console.print(f"table_vs_every_route: {result['table_vs_every_route']} (rounds {ratios})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"written: {RESULTS.relative_to(RESULTS.parent.parent.parent)}")


if __name__ == "__main__":
    main()

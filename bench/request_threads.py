"""Request threads a server process: authenticated reads with 8 threads against 40.

Requests take turns on the GIL, so threads past a few only contend for it. For each
database, `nebula serve --workers 2` is started afresh for each thread count in turn, in
interleaved rounds, seeded as bench/api_load.py seeds it, and driven by wrk with the reads
workload (authenticated GETs of workspaces, datasets, jobs and metrics) at 64 connections.
Medians over the rounds with their spread; the ratio is taken within each round.

Prints a table, writes bench/results/request_threads.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_load import Server, database, load_average, seed, wrk

RESULTS = Path(__file__).resolve().parent / "results" / "request_threads.json"
CONNECTIONS = 64
WORKERS = 2


def reads(kind: str, threads: int, duration_s: int) -> dict[str, Any]:
    """One fresh server with `threads` request threads, seeded, then one wrk run of reads."""
    with tempfile.TemporaryDirectory(prefix=f"nebula-threads-{kind}-") as tmp:
        folder = Path(tmp)
        with database(kind, folder) as url, Server(folder, url, WORKERS, threads) as server:
            plan = folder / "plan.lua"
            plan.write_text(seed(server).plan_lua(set()))
            wrk(server.url, plan, "reads", CONNECTIONS, 3)  # warm up
            return wrk(server.url, plan, "reads", CONNECTIONS, duration_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="8,40", help="thread counts, the first compared")
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    kinds = args.databases.split(",")
    console = Console()
    load_before = load_average()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {k: {t: [] for t in counts} for k in kinds}
    with Progress(console=console) as progress:
        task = progress.add_task("request threads", total=args.rounds * len(kinds) * len(counts))
        for round_no in range(1, args.rounds + 1):
            for kind in kinds:
                for threads in counts:
                    label = f"{kind}: {threads} threads, round {round_no}"
                    progress.update(task, description=label)
                    runs[kind][threads].append(reads(kind, threads, args.duration))
                    progress.advance(task)

    result: dict[str, Any] = {
        "connections": CONNECTIONS,
        "workers": WORKERS,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": load_average(),
        "rows": {},
    }
    table = Table(title=f"reads @{CONNECTIONS}, --workers {WORKERS}, {args.rounds} rounds")
    for column in ("database", "threads", "req/s (min-max)", "p50 ms", "p99 ms", "errors"):
        table.add_column(column, justify="right")
    base = counts[0]
    for kind in kinds:
        for threads in counts:
            group = runs[kind][threads]
            rate = [r["req_s"] for r in group]
            row = {
                "req_s": round(statistics.median(rate), 1),
                "req_s_min": round(min(rate), 1),
                "req_s_max": round(max(rate), 1),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in group), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in group), 2),
                "errors": sum(r["errors"] for r in group),
            }
            result["rows"][f"{kind}@{threads}"] = row
            table.add_row(
                kind,
                str(threads),
                f"{row['req_s']:.0f} ({row['req_s_min']:.0f}-{row['req_s_max']:.0f})",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                str(row["errors"]),
            )
        for threads in counts[1:]:
            ratios = [
                a["req_s"] / b["req_s"]
                for a, b in zip(runs[kind][base], runs[kind][threads], strict=True)
            ]
            result[f"threads_{base}_vs_{threads}_{kind}"] = round(statistics.median(ratios), 3)
            result[f"threads_{base}_vs_{threads}_{kind}_rounds"] = [round(x, 3) for x in ratios]
    console.print(table)
    for key, value in result.items():
        if key.startswith("threads_") and not key.endswith("_rounds"):
            console.print(f"{key}: {value} (rounds {result[key + '_rounds']})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"written: {RESULTS.relative_to(RESULTS.parent.parent.parent)}")


if __name__ == "__main__":
    main()

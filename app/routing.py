"""API routes whose plain-function endpoints cost one hop to the thread pool, not two.

FastAPI runs a plain (`def`) endpoint on the thread pool, then hops there once more to
validate what it returned against the response model. Here such an endpoint is run on
the thread pool from a coroutine of its own: its blocking work (the database) still never
runs on the event loop, and the check of the answer, microseconds for the models the
endpoints build, runs on the loop without a second hop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from contract import API_PREFIX


def on_thread_pool(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` as a coroutine that runs it on the thread pool (a coroutine stays as is)."""
    if inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)  # FastAPI reads the parameters and markers of the original
    async def threaded(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return threaded


class OneHopRoute(APIRoute):
    """An API route whose endpoint, if a plain function, runs on the thread pool once."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, on_thread_pool(endpoint), **kwargs)


def api_router(tag: str, *, prefix: str = API_PREFIX) -> APIRouter:
    """The router of one part of the API: its paths under `prefix`, its endpoints one hop each."""
    return APIRouter(prefix=prefix, tags=[tag], route_class=OneHopRoute)

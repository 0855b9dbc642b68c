"""API routes whose endpoints cost one hop to the thread pool, not two or three.

FastAPI runs a plain (`def`) endpoint on the thread pool, each plain dependency in a hop
of its own before it, then hops there once more to validate what the endpoint returned
against the response model. Here the blocking work of a request goes in one hop: the
dependencies that need I/O hand back an `InHop` value instead of doing it (the caller's
credential, to be looked up), and the route resolves those on the thread pool right
before the endpoint runs, in the same hop. The check of the answer, microseconds for the
models the endpoints build, runs on the loop. Nothing blocking runs on the event loop.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from contract import API_PREFIX


class InHop(ABC):
    """A dependency's value whose blocking part runs in the endpoint's hop, first."""

    @abstractmethod
    def resolve(self) -> None:
        """Do the blocking part; raise a domain error to refuse the request."""

    @abstractmethod
    def resolve_apart(self) -> None:
        """Resolve for an answer given before the endpoint ran (a 422): its refusal comes first."""


def _resolve_all(values: dict[str, Any]) -> None:
    for value in values.values():
        if isinstance(value, InHop):
            value.resolve()


def on_thread_pool(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` as a coroutine that resolves its InHop arguments, then runs it.

    A plain function runs on the thread pool with its arguments resolved in the same hop;
    a coroutine stays on the loop, its InHop arguments resolved in one hop before it.
    """
    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)  # FastAPI reads the parameters and markers of the original
        async def resolved_first(*args: Any, **kwargs: Any) -> Any:
            if any(isinstance(v, InHop) for v in kwargs.values()):
                await run_in_threadpool(_resolve_all, kwargs)
            return await endpoint(*args, **kwargs)

        return resolved_first

    def run(*args: Any, **kwargs: Any) -> Any:
        _resolve_all(kwargs)
        return endpoint(*args, **kwargs)

    @functools.wraps(endpoint)
    async def threaded(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(run, *args, **kwargs)

    return threaded


class OneHopRoute(APIRoute):
    """An API route whose blocking work (InHop arguments, a plain endpoint) is one hop."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, on_thread_pool(endpoint), **kwargs)


def api_router(tag: str, *, prefix: str = API_PREFIX) -> APIRouter:
    """The router of one part of the API: its paths under `prefix`, its endpoints one hop each."""
    return APIRouter(prefix=prefix, tags=[tag], route_class=OneHopRoute)

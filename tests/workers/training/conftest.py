"""Fixtures for the training tests: the demo corpus, link pairs (in-process or real switches), roles in threads."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock

from support.certs import make_pki
from support.switches import start_pair
from workers.switch.link import Link, LinkEstimate, LocalLink, Payload
from workers.training.data import write_demo_corpus
from workers.training.electra import (
    ElectraConfig,
    run_electra_discriminator,
    run_electra_generator,
)
from workers.training.hooks import RoleResult

LinkPairs = Callable[[str, str], tuple[Link, Link]]


@pytest.fixture(autouse=True)
def _one_thread_per_role() -> Iterator[None]:
    """Two roles run side by side on a shared 2-core machine: one intra-op thread each."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo corpus, written once per test session."""
    return write_demo_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def text_lines(corpus: dict[str, Path]) -> list[str]:
    """All lines of the demo's mixed es/en text."""
    return corpus["text"].read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="session")
def pairs(corpus: dict[str, Path]) -> dict[str, tuple[list[str], list[str]]]:
    """Source and target sides of each parallel split."""
    out = {}
    for split in ("train", "valid", "test"):
        rows = corpus[f"parallel.{split}"].read_text(encoding="utf-8").splitlines()
        out[split] = ([r.split("\t")[0] for r in rows], [r.split("\t")[1] for r in rows])
    return out


# ---------------------------------------------------------------- links


@pytest.fixture(params=["local", "switch"])
def link_pairs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LinkPairs]:
    """`connect(role_a, role_b)`: two connected Links, in-process or through two real switches."""
    opened: list[Link] = []
    # two switches on loopback with mutual TLS, certificates from a throwaway CA
    switches = (
        start_pair(make_pki(tmp_path / "pki", "Training test CA"))
        if request.param == "switch"
        else None
    )
    counter = iter(range(1_000_000))

    def connect(role_a: str, role_b: str) -> tuple[Link, Link]:
        if switches is None:
            a, b = LocalLink.pair()
        else:
            a, b = switches.link_pair(f"job-{next(counter)}", role_a, role_b)
        opened.extend((a, b))
        return a, b

    yield connect
    for link in opened:
        link.close()
    if switches is not None:
        switches.stop()


@pytest.fixture
def local_links() -> LinkPairs:
    """`connect(role_a, role_b)`: an in-process pair."""
    return lambda _a, _b: LocalLink.pair()


class RecordingLink:
    """A Link that keeps a copy of everything it carried, for assertions on what crossed."""

    def __init__(self, inner: Link) -> None:
        self.inner = inner
        self.sent: list[tuple[str, Payload]] = []
        self.received: list[tuple[str, Payload]] = []

    def send(self, channel: str, payload: Payload) -> None:
        self.sent.append((channel, payload))
        self.inner.send(channel, payload)

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        payload = self.inner.recv(channel, timeout)
        self.received.append((channel, payload))
        return payload

    def bytes_sent(self) -> dict[str, int]:
        return self.inner.bytes_sent()

    def link_estimate(self) -> LinkEstimate | None:
        return self.inner.link_estimate()

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------- roles in threads


@dataclass
class Outcome:
    """Results (or errors) of two roles run side by side."""

    a: Any
    b: Any


def run_pair(role_a: Callable[[], Any], role_b: Callable[[], Any], timeout: float = 900) -> Outcome:
    """Run two role functions in two threads, as two clusters would; re-raise their errors."""
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def wrap(name: str, fn: Callable[[], Any]) -> None:
        try:
            results[name] = fn()
        except BaseException as exc:
            errors[name] = exc

    threads = [
        threading.Thread(target=wrap, args=("a", role_a), daemon=True),
        threading.Thread(target=wrap, args=("b", role_b), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a role did not finish"
    for name, exc in errors.items():
        raise AssertionError(f"role {name} failed: {exc!r}") from exc
    return Outcome(results["a"], results["b"])


@pytest.fixture
def run_roles() -> Callable[..., Outcome]:
    """`run_roles(fn_a, fn_b)`: run two role functions side by side; re-raise their errors."""
    return run_pair


@pytest.fixture
def recording() -> type[RecordingLink]:
    """The RecordingLink class (a Link wrapper that keeps what it carried)."""
    return RecordingLink


def _session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test session's folder, the same for every pytest-xdist worker of the session."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_electra(
    tmp_path_factory: pytest.TempPathFactory, text_lines: list[str]
) -> tuple[RoleResult, RoleResult]:
    """The `tiny` preset trained on the demo text by the two roles (shared by the slow tests).

    Trained once per session, not once per worker: the first worker to need it trains it
    under a file lock and leaves the results beside the artifacts; the others read them.
    """
    root = _session_folder(tmp_path_factory) / "tiny-electra"
    results = root / "results.pickle"
    root.mkdir(exist_ok=True)
    with FileLock(root.with_suffix(".lock")):
        if results.is_file():
            trained: tuple[RoleResult, RoleResult] = pickle.loads(results.read_bytes())
            return trained
        torch.set_num_threads(1)
        cfg = ElectraConfig.tiny()
        g_link, d_link = LocalLink.pair()
        out = run_pair(
            lambda: run_electra_generator(cfg, g_link, text_lines, root / "g", seed=1),
            lambda: run_electra_discriminator(cfg, d_link, text_lines, root / "d", seed=1),
        )
        results.write_bytes(pickle.dumps((out.a, out.b)))
        return out.a, out.b

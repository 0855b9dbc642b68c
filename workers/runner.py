"""Running one role of one job on this cluster: the real logic behind the Celery task.

The task hands over ids. The role claims its attempt through the cluster API (which
answers with its job token and its job's config), reads only its own inputs through
that API (grant checked, audited and decrypted on the control plane), talks to its peer
role only through this cluster's switch, beats a heartbeat that renews its token and
fences it out when its attempt is replaced, and reports metrics in numbered batches.
A worker holds no database URL, no platform secret and no data key.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from contract.cluster_api import MAX_ERROR_MESSAGE, ErrorCode, Rendezvous
from contract.devices import DeviceInfo
from contract.kinds import KINDS, REPLICA_OF, replica_rank
from contract.text import split_lines
from workers.control_plane import (
    ClusterClient,
    ControlPlaneError,
    Fenced,
    Refused,
    RoleSession,
    retrying,
)
from workers.presence import instance_name
from workers.switch.link import Link
from workers.training import sealed
from workers.training.hooks import Hooks, ReportableError, RoleResult

log = logging.getLogger("nebula.runner")

METRICS_FLUSH_S = 1.0


def resolve_device(choice: str) -> str:
    """`nebula worker --device`: cpu, cuda (refused where no CUDA device is), or auto (CUDA
    when present)."""
    import torch

    if choice not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be cpu, cuda or auto, not {choice!r}")
    if choice == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        raise ValueError("--device cuda, but torch sees no CUDA device on this host")
    return "cpu"


def describe_device(device: str) -> DeviceInfo:
    """What a worker tells the control plane of its device: cheap facts, read once."""
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return DeviceInfo(
            kind="cuda",
            name=_printable(props.name),
            count=torch.cuda.device_count(),
            memory_bytes=int(props.total_memory),
            runtime=_printable(torch.version.cuda or "").replace(" ", ""),
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return DeviceInfo(kind="cpu", name=_cpu_model(), count=cores or 1)


def _cpu_model() -> str:
    """The processor's model name as Linux tells it, or "" elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return _printable(line.partition(":")[2].strip())
    except OSError:
        pass
    return ""


def _printable(text: str) -> str:
    return "".join(c for c in text if " " <= c <= "~")[:128]


@dataclass(frozen=True)
class ClusterSide:
    """What a worker knows: its cluster, its switch, the CA, the control plane, its credential."""

    cluster: str
    switch_address: tuple[str, int]
    ca_path: Path
    scratch_dir: Path  # cluster-local disk for checkpoints
    control_plane: str = "http://127.0.0.1:8000"
    credential: str = field(default="", repr=False)
    control_plane_ca: Path | None = None  # trust for an https control plane; None: the system's
    main_pid: int = field(default_factory=os.getpid)  # the worker's main process (pre-fork)
    rendezvous_host: str = "127.0.0.1"  # where the cluster's other workers reach this host
    # what this worker trains on (`nebula worker --device`); a role runs there unless its
    # job asks for the CPU (the claim's answer says where)
    device: str = "cpu"

    def client(self) -> ClusterClient:
        """A client of the cluster API with this cluster's worker credential."""
        return ClusterClient(
            self.control_plane, credential=self.credential, ca_path=self.control_plane_ca
        )


@dataclass(frozen=True)
class _Batch:
    seq: int
    points: list[tuple[int, dict[str, float]]]
    checkpoint_step: int | None


class RoleHooks(Hooks):
    """Sends metrics in numbered batches and beats the heartbeat; stops when told or cut off.

    A batch stays queued until the control plane acknowledged it, so nothing is lost when
    a call fails, and its number makes a retry harmless. Without an answer from the control
    plane for `grace_s`, the role stops itself (the reaper restarts the attempt by then).
    """

    def __init__(self, session: RoleSession) -> None:
        super().__init__()
        self.session = session
        self.heartbeat_s = session.claim.heartbeat_s
        self.grace_s = session.claim.grace_s
        self._points: list[tuple[int, dict[str, float]]] = []
        self._checkpoint: int | None = None
        self._unsent: list[_Batch] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._last_answer = time.monotonic()
        self.refused: Refused | None = None
        self.on_stop: Callable[[], None] | None = None
        self._thread = threading.Thread(
            target=self._beat, name=f"heartbeat-{session.claim.role}", daemon=True
        )
        self._thread.start()
        self.on_metrics = self._collect
        self.should_stop = self._stop.is_set
        self.on_checkpoint = self._checkpointed

    def _collect(self, step: int, values: dict[str, float]) -> None:
        with self._lock:
            self._points.append((step, dict(values)))

    def _checkpointed(self, step: int, _path: Path) -> None:
        with self._lock:
            self._checkpoint = step

    def _heard_back(self) -> None:
        self._last_answer = time.monotonic()

    def _stop_for(self, exc: ControlPlaneError) -> None:
        log.warning("role %s stops: %s", self.session.claim.role, exc)
        if isinstance(exc, Refused):
            self.refused = exc
        self.request_stop()

    def flush(self) -> None:
        """Queue what was collected as the next batch and send every unacknowledged batch."""
        with self._lock:
            if self._points or self._checkpoint is not None:
                self._seq += 1
                self._unsent.append(_Batch(self._seq, self._points, self._checkpoint))
                self._points, self._checkpoint = [], None
        with self._send_lock:
            while self._unsent:
                batch = self._unsent[0]
                self.session.post_metrics(
                    seq=batch.seq, points=batch.points, checkpoint_step=batch.checkpoint_step
                )
                self._heard_back()
                self._unsent.pop(0)

    def request_stop(self) -> None:
        """Stop the role: the loop sees should_stop; a blocked receive is woken by on_stop."""
        if not self._stop.is_set():
            self._stop.set()
            if self.on_stop is not None:
                self.on_stop()

    def _beat(self) -> None:
        last_beat = 0.0
        while not self._done.wait(METRICS_FLUSH_S):
            try:
                self.flush()
                if time.monotonic() - last_beat >= self.heartbeat_s:
                    last_beat = time.monotonic()
                    self.session.heartbeat()
                    self._heard_back()
            except (Fenced, Refused) as exc:
                self._stop_for(exc)
            except (httpx.TransportError, ControlPlaneError) as exc:
                silent = time.monotonic() - self._last_answer
                if silent > self.grace_s:
                    log.error("no answer from the control plane for %.0f s; stopping", silent)
                    self.request_stop()
                else:
                    log.warning("cluster API call failed (%s); keeping on", exc)
            except Exception:
                log.exception("heartbeat of %s failed", self.session.claim.role)

    def close(self) -> None:
        """Stop beating and send what is left (retrying for the grace period)."""
        self._done.set()
        self._thread.join(timeout=10)
        try:
            retrying(self.flush, within_s=self.grace_s, what="the last metric batch")
        except (Fenced, Refused) as exc:
            self._stop_for(exc)
        except (httpx.TransportError, ControlPlaneError) as exc:
            log.error("the last metrics of %s were not delivered: %s", self.session.claim.role, exc)

    @property
    def stopped(self) -> bool:
        """Whether the role was told to stop (cancelled, failed elsewhere, fenced out)."""
        return self._stop.is_set()


@dataclass
class RoleInputs:
    """What a role reads, already decrypted, and nothing more: by input name, the lines of a
    text or parallel dataset, the bytes of a model."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    def text(self, name: str) -> list[str]:
        """The lines of an input the role must have."""
        return self.lines[name]

    def model(self) -> bytes:
        """The one model the role reads."""
        (data,) = self.files.values()
        return data


def _read_inputs(session: RoleSession) -> RoleInputs:
    """The role's inputs through the cluster API (each read checked and audited there).

    The claim names the inputs this role may read (the kinds table's reads, as the control
    plane resolved them for this job); the table says which dataset kind each is.
    """
    spec = KINDS[session.claim.kind]
    dataset_kinds = {**spec.inputs, **spec.optional_inputs}
    inputs = RoleInputs()
    for name in session.claim.inputs:
        chunks = session.read_input(name)
        if dataset_kinds[name] == "model":
            inputs.files[name] = b"".join(chunks)
        else:
            inputs.lines[name] = list(split_lines(chunks))
    return inputs


# (config, link, inputs, checkpoint folder, hooks, seed, device) -> the role's result
RoleEntry = Callable[[Any, Link, RoleInputs, Path, Hooks, int, str], RoleResult]


def _electra_generator(
    cfg: Any, link: Link, inputs: RoleInputs, ckpt_dir: Path, hooks: Hooks, seed: int, device: str
) -> RoleResult:
    from workers.training.electra import run_electra_generator

    init = inputs.files.get("init_generator")
    text = inputs.text("text")
    return run_electra_generator(
        cfg, link, text, ckpt_dir, hooks, seed=seed, device=device, init_model=init
    )


def _electra_discriminator(
    cfg: Any, link: Link, inputs: RoleInputs, ckpt_dir: Path, hooks: Hooks, seed: int, device: str
) -> RoleResult:
    from workers.training.electra import run_electra_discriminator

    # without the text (discriminator_reads_text=false) whole sequences cross instead
    text, init = inputs.lines.get("text"), inputs.files.get("init_discriminator")
    return run_electra_discriminator(
        cfg, link, text, ckpt_dir, hooks, seed=seed, device=device, init_model=init
    )


def _abnet_side(
    cfg: Any,
    link: Link,
    inputs: RoleInputs,
    ckpt_dir: Path,
    hooks: Hooks,
    seed: int,
    device: str,
    *,
    encoder: bool,
) -> RoleResult:
    from workers.training.abnet import run_abnet_decoder, run_abnet_encoder

    lines, model, evals = inputs.text("parallel"), inputs.model(), inputs.lines.get("eval")
    if encoder:
        return run_abnet_encoder(
            cfg,
            link,
            lines,
            model,
            ckpt_dir,
            hooks,
            eval_source_lines=evals,
            seed=seed,
            device=device,
        )
    return run_abnet_decoder(
        cfg, link, lines, model, ckpt_dir, hooks, eval_target_lines=evals, seed=seed, device=device
    )


# the training code of each (kind, role) of the kinds table; a test holds it to the table
ROLE_ENTRIES: dict[tuple[str, str], RoleEntry] = {
    ("electra_pretrain", "generator"): _electra_generator,
    ("electra_pretrain", "discriminator"): _electra_discriminator,
    ("abnet_finetune", "encoder"): functools.partial(_abnet_side, encoder=True),
    ("abnet_finetune", "decoder"): functools.partial(_abnet_side, encoder=False),
}


def _report(role: str, result: RoleResult) -> dict[str, Any]:
    """The role's end in numbers only (contract RoleReport): no text leaves this way."""
    return {
        "start_step": result.start_step,
        "last_step": result.last_step,
        "final_metrics": _finite(result.history[-1] if result.history else {}),
        "extra": _finite(result.extra),
    }


def _finite(values: dict[str, float]) -> dict[str, float]:
    # a diverged loss is NaN; the report's schema, like a chart, takes numbers only
    return {name: float(v) for name, v in values.items() if math.isfinite(v)}


def _error_message(exc: BaseException) -> str:
    """What the control plane is told of a failure: the exception's class, and its text
    only when Nebula wrote that text from fixed words and numbers (ReportableError) or the
    control plane itself did (ControlPlaneError).

    Any other exception's text can quote data (a line that failed to parse); its class
    cannot. The full text stays in this cluster's log.
    """
    if isinstance(exc, ReportableError):
        text = f"{type(exc).__name__}: {exc}"
    elif isinstance(exc, ControlPlaneError):
        text = exc.detail
    else:
        text = type(exc).__name__
    printable = "".join(c if " " <= c <= "~" else "?" for c in text)
    return printable[:MAX_ERROR_MESSAGE]


class CredentialRefused(Exception):
    """The control plane refused this cluster's worker credential (revoked or unknown)."""


FINAL_JOB_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _finish(session: RoleSession, outcome: str, **kwargs: Any) -> str | None:
    """Report how the role ended; the job's status afterwards, None when unknown."""
    try:
        return retrying(
            lambda: session.finish(outcome, **kwargs),
            within_s=session.claim.grace_s,
            what=f"reporting {outcome}",
        )
    except Fenced:
        return None  # the attempt is over anyway
    except (httpx.TransportError, ControlPlaneError) as exc:
        log.error("could not report %s for role %s: %s", outcome, session.claim.role, exc)
        return None


def _forget_if_final(side: ClusterSide, job_id: str, job_status: str | None) -> None:
    """A job that ended for good leaves nothing on the cluster: its scratch folder goes
    (checkpoints, tokenizer, artifact). A job that goes on keeps it, to resume from."""
    if job_status in FINAL_JOB_STATUSES:
        shutil.rmtree(side.scratch_dir / "jobs" / job_id, ignore_errors=True)


def run_role(*, job_id: str, role: str, attempt: int, side: ClusterSide) -> str:
    """Run one role of one attempt to its end; returns what happened, for the worker's log.

    Raises CredentialRefused when the cluster's credential is refused, so that the worker
    stops taking tasks.
    """
    # the pool child names itself after its worker (the process that reports in)
    worker = f"{instance_name(side.cluster, side.main_pid)}/{os.getpid()}"
    client = side.client()
    try:
        try:
            session = client.claim(
                job_id=job_id, role=role, attempt=attempt, worker=worker, device=side.device
            )
        except Fenced as exc:
            # a stale attempt, or a role that needs a device this worker lacks (the control
            # plane failed the job, saying so)
            log.info("not claimed: %s/%s attempt %d: %s", job_id, role, attempt, exc.detail)
            return "stale"
        except Refused as exc:
            raise CredentialRefused(str(exc)) from None
        except ControlPlaneError as exc:
            if exc.status != 404:
                raise
            return "stale"  # no such role on this cluster: a task from elsewhere, or gone
        outcome = _run_claimed(session, side)
        if outcome.refused is not None and outcome.refused.status == 401:
            raise CredentialRefused(str(outcome.refused))
        return outcome.name
    finally:
        client.close()


@dataclass
class _Outcome:
    name: str
    job_status: str | None  # as the control plane answered the role's finish
    refused: Refused | None = None


def _await_rendezvous(session: RoleSession, hooks: RoleHooks, timeout_s: float) -> Rendezvous:
    """Wait for the root discriminator to publish where this replica joins."""
    deadline = time.monotonic() + timeout_s
    tick = threading.Event()
    while not hooks.stopped:
        found = session.read_rendezvous()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            break
        tick.wait(0.5)
    raise Fenced(409, "no rendezvous from the discriminator (stopped or timed out)")


def _run_replica(session: RoleSession, side: ClusterSide, hooks: RoleHooks) -> RoleResult:
    """A discriminator replica: no input, no link; the root's process group is its channel."""
    from workers.training.electra.replicas import run_discriminator_replica
    from workers.training.job_config import training_config

    claim = session.claim
    rank = replica_rank(claim.role)
    assert rank is not None
    cfg = training_config(claim.kind, claim.config)
    rendezvous = _await_rendezvous(session, hooks, cfg.recv_timeout_s)
    # the root's checkpoints: the cluster's workers share its scratch folder
    ckpt_dir = side.scratch_dir / "jobs" / claim.job_id / REPLICA_OF
    seed = int(claim.config.get("seed", 0))
    return run_discriminator_replica(
        cfg, rank, rendezvous, ckpt_dir, seed=seed, device=claim.device, key=session.checkpoint_key
    )


def _run_trainer(
    session: RoleSession, side: ClusterSide, hooks: RoleHooks, links: list[Link]
) -> RoleResult:
    """A role that trains with its peer through the switch, on the inputs it reads."""
    from workers.switch.client import SwitchLink
    from workers.training.job_config import training_config

    claim = session.claim
    inputs = _read_inputs(session)
    cfg = training_config(claim.kind, claim.config)
    link = SwitchLink(
        side.switch_address,
        ca_path=side.ca_path,
        token=session.token,
        job_id=f"{claim.job_id}.{claim.attempt}",
        role=claim.role,
        peer_role=claim.peer_role,
    )
    links.append(link)
    hooks.on_stop = link.close
    if hooks.stopped:
        # told to stop while the inputs were read, before there was a link to close: a
        # HELLO to a peer that already failed would otherwise be resent until the timeout
        link.close()
    ckpt_dir = side.scratch_dir / "jobs" / claim.job_id / claim.role
    seed = int(claim.config.get("seed", 0))
    entry = ROLE_ENTRIES[(claim.kind, claim.role)]
    return entry(cfg, link, inputs, ckpt_dir, hooks, seed, claim.device)


def _run_claimed(session: RoleSession, side: ClusterSide) -> _Outcome:
    """Run a claimed role to its end, report it, and forget the job here if it is over."""
    outcome = _run_and_report(session, side)
    _forget_if_final(side, session.claim.job_id, outcome.job_status)
    return outcome


def _run_and_report(session: RoleSession, side: ClusterSide) -> _Outcome:
    claim = session.claim
    hooks = RoleHooks(session)
    hooks.publish_rendezvous = session.publish_rendezvous
    hooks.rendezvous_host = side.rendezvous_host
    hooks.checkpoint_key = session.checkpoint_key
    links: list[Link] = []
    try:
        if replica_rank(claim.role) is not None:
            result = _run_replica(session, side, hooks)
        else:
            result = _run_trainer(session, side, hooks, links)
    except Exception as exc:
        hooks.close()
        if isinstance(exc, Fenced | Refused):
            hooks.request_stop()
            hooks.refused = exc if isinstance(exc, Refused) else hooks.refused
        if hooks.stopped:
            return _Outcome("stopped", _finish(session, "stopped"), hooks.refused)
        log.exception("role %s of job %s failed", claim.role, claim.job_id)
        code = ErrorCode.resources if isinstance(exc, MemoryError | OSError) else ErrorCode.training
        error = _error_message(exc)
        return _Outcome("failed", _finish(session, "failed", error_code=code, error=error))
    finally:
        for link in links:
            link.close()
    hooks.close()
    if result.stopped or hooks.stopped:
        return _Outcome("stopped", _finish(session, "stopped"), hooks.refused)
    try:
        if result.artifact is not None and result.artifact.exists():
            # sealed on this disk; the control plane encrypts it again for the owner
            session.upload_artifact(sealed.read(result.artifact, session.checkpoint_key))
    except (Fenced, Refused):
        return _Outcome("stopped", _finish(session, "stopped"))
    except (httpx.TransportError, ControlPlaneError) as exc:
        error = ("storing the artifact failed: " + _error_message(exc))[:MAX_ERROR_MESSAGE]
        return _Outcome(
            "failed", _finish(session, "failed", error_code=ErrorCode.artifact, error=error)
        )
    report = _report(claim.role, result)
    return _Outcome("succeeded", _finish(session, "succeeded", report=report))

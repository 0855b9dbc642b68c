"""Running one role of one job on this cluster: the real logic behind the Celery task.

The task hands over ids; everything else is read from the database here. The role
opens only its own inputs through the grant-checked reader, talks to its peer role
only through this cluster's switch, beats a heartbeat that also fences it out when
its attempt is replaced, and reports metrics in batches.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine, make_sessionmaker
from app.jobs import service as jobs
from app.jobs.models import Job
from app.settings import Settings
from workers.switch.link import Link
from workers.training.runtime import Hooks, RoleResult

log = logging.getLogger("nebula.runner")

HEARTBEAT_S = 2.0
METRICS_FLUSH_S = 1.0
PEER_ROLE = {
    "generator": "discriminator",
    "discriminator": "generator",
    "encoder": "decoder",
    "decoder": "encoder",
}


@dataclass(frozen=True)
class ClusterSide:
    """What a worker knows about its own cluster: its name, its switch, the CA to trust."""

    cluster: str
    switch_address: tuple[str, int]
    ca_path: Path
    scratch_dir: Path  # cluster-local disk for checkpoints


class RoleHooks(Hooks):
    """Batches metrics to the database and beats the heartbeat; stops when fenced out."""

    def __init__(
        self, factory: sessionmaker[Session], *, job_id: str, role: str, attempt: int
    ) -> None:
        super().__init__()
        self.factory, self.job_id, self.role, self.attempt = factory, job_id, role, attempt
        self._points: list[tuple[int, dict[str, float]]] = []
        self._checkpoint: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self.on_stop: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{role}", daemon=True)
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

    def flush(self) -> None:
        """Write the buffered points; a fenced-out attempt is told to stop."""
        with self._lock:
            points, self._points = self._points, []
            checkpoint, self._checkpoint = self._checkpoint, None
        if not points and checkpoint is None:
            return
        with self.factory() as db:
            alive = jobs.record_metrics(
                db,
                job_id=self.job_id,
                role=self.role,
                attempt=self.attempt,
                points=points,
                checkpoint_step=checkpoint,
            )
        if not alive:
            self.request_stop()

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
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    last_beat = time.monotonic()
                    with self.factory() as db:
                        if not jobs.role_alive(
                            db, job_id=self.job_id, role=self.role, attempt=self.attempt
                        ):
                            self.request_stop()
            except Exception:
                log.exception("heartbeat of %s/%s failed", self.job_id, self.role)

    def close(self) -> None:
        """Stop beating and write what is left."""
        self._done.set()
        self._thread.join(timeout=10)
        self.flush()

    @property
    def stopped(self) -> bool:
        """Whether the role was told to stop (cancelled, failed elsewhere, fenced out)."""
        return self._stop.is_set()


@dataclass
class RoleInputs:
    """What a role reads, already decrypted, and nothing more."""

    lines: list[str] | None = None
    eval_lines: list[str] | None = None
    model: bytes | None = None


def _read_inputs(db: Session, *, job: Job, role: str, settings: Settings) -> RoleInputs:
    from app.grants.service import open_dataset_for_job

    def lines(name: str, column: int | None = None) -> list[str]:
        reader = open_dataset_for_job(
            db, user_id=job.owner_id, dataset_id=job.inputs[name], job_id=job.id, settings=settings
        )
        if column is None:
            return list(reader.iter_lines())
        # Each side of a parallel corpus keeps only its own column: no cluster holds pairs.
        return [line.split("\t", 1)[column] for line in reader.iter_lines()]

    def blob(name: str) -> bytes:
        reader = open_dataset_for_job(
            db, user_id=job.owner_id, dataset_id=job.inputs[name], job_id=job.id, settings=settings
        )
        return b"".join(reader.iter_chunks())

    if job.kind == "electra_pretrain":
        reads_text = role == "generator" or bool(job.config.get("discriminator_reads_text", True))
        return RoleInputs(lines=lines("text") if reads_text else None)
    column = 0 if role == "encoder" else 1
    return RoleInputs(
        lines=lines("parallel", column),
        eval_lines=lines("eval", column) if "eval" in job.inputs else None,
        model=blob("source_model" if role == "encoder" else "target_model"),
    )


def _train(
    job: Job, role: str, cfg: Any, link: Link, inputs: RoleInputs, ckpt_dir: Path, hooks: Hooks
) -> RoleResult:
    seed = int(job.config.get("seed", 0))
    if role == "generator":
        from workers.training.electra import run_electra_generator

        assert inputs.lines is not None
        return run_electra_generator(cfg, link, inputs.lines, ckpt_dir, hooks, seed=seed)
    if role == "discriminator":
        from workers.training.electra import run_electra_discriminator

        return run_electra_discriminator(cfg, link, inputs.lines, ckpt_dir, hooks, seed=seed)
    assert inputs.lines is not None and inputs.model is not None
    if role == "encoder":
        from workers.training.abnet import run_abnet_encoder

        return run_abnet_encoder(
            cfg,
            link,
            inputs.lines,
            inputs.model,
            ckpt_dir,
            hooks,
            eval_source_lines=inputs.eval_lines,
            seed=seed,
        )
    from workers.training.abnet import run_abnet_decoder

    return run_abnet_decoder(
        cfg,
        link,
        inputs.lines,
        inputs.model,
        ckpt_dir,
        hooks,
        eval_target_lines=inputs.eval_lines,
        seed=seed,
    )


def _store_outputs(
    db: Session, *, job: Job, role: str, result: RoleResult, settings: Settings
) -> None:
    from app.jobs.outputs import store_job_output

    if result.artifact is not None and result.artifact.exists():
        kind = "model" if role == "discriminator" else "adapters"
        name = f"{job.kind}-{job.id[:8]}-{role}.safetensors"
        dataset_id = store_job_output(
            db,
            job_id=job.id,
            workspace_id=job.workspace_id,
            owner_id=job.owner_id,
            name=name,
            kind="model",
            path=result.artifact,
            settings=settings,
        )
        jobs.add_artifact(
            db,
            job_id=job.id,
            name=name,
            kind=kind,
            dataset_id=dataset_id,
            size_bytes=result.artifact.stat().st_size,
            details={"role": role},
        )
    report = {
        "role": role,
        "start_step": result.start_step,
        "last_step": result.last_step,
        "final_metrics": result.history[-1] if result.history else {},
        **{f"extra.{k}": v for k, v in result.extra.items()},
    }
    jobs.add_artifact(
        db,
        job_id=job.id,
        name=f"report-{role}.json",
        kind="report",
        dataset_id=None,
        size_bytes=len(json.dumps(report)),
        details=report,
    )
    db.commit()


def run_role(
    *, job_id: str, role: str, attempt: int, token: str, side: ClusterSide, settings: Settings
) -> str:
    """Run one role of one attempt to its end; returns what happened, for the worker's log."""
    engine = make_engine(settings.resolved_database_url)
    factory = make_sessionmaker(engine)
    worker = f"{socket.gethostname()}:{side.cluster}:{os.getpid()}"
    try:
        with factory() as db:
            if not jobs.start_role(db, job_id=job_id, role=role, attempt=attempt, worker=worker):
                return "stale"
            job = db.get(Job, job_id)
            assert job is not None
            db.expunge(job)
        hooks = RoleHooks(factory, job_id=job_id, role=role, attempt=attempt)
        link: Link | None = None
        try:
            with factory() as db:
                inputs = _read_inputs(db, job=job, role=role, settings=settings)
            cfg = jobs.training_config(job.kind, job.config)
            from workers.switch.client import SwitchLink

            link = SwitchLink(
                side.switch_address,
                ca_path=side.ca_path,
                token=token,
                job_id=f"{job_id}.{attempt}",
                role=role,
                peer_role=PEER_ROLE[role],
            )
            hooks.on_stop = link.close
            ckpt_dir = side.scratch_dir / "jobs" / job_id / role
            result = _train(job, role, cfg, link, inputs, ckpt_dir, hooks)
        except Exception as exc:
            hooks.close()
            if hooks.stopped:
                with factory() as db:
                    jobs.mark_role_stopped(db, job_id=job_id, role=role, attempt=attempt)
                return "stopped"
            log.exception("role %s of job %s failed", role, job_id)
            with factory() as db:
                jobs.finish_role(
                    db,
                    job_id=job_id,
                    role=role,
                    attempt=attempt,
                    ok=False,
                    error=f"{type(exc).__name__}: {exc}"[:2000],
                )
            return "failed"
        finally:
            if link is not None:
                link.close()
        hooks.close()
        if result.stopped or hooks.stopped:
            with factory() as db:
                jobs.mark_role_stopped(db, job_id=job_id, role=role, attempt=attempt)
            return "stopped"
        with factory() as db:
            _store_outputs(db, job=job, role=role, result=result, settings=settings)
            jobs.finish_role(db, job_id=job_id, role=role, attempt=attempt, ok=True)
        return "succeeded"
    finally:
        engine.dispose()

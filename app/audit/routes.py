"""HTTP routes of the audit log (admins and auditors)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import Query, Request
from fastapi.responses import StreamingResponse

from app.audit import names, service
from app.audit.anchor import anchor_signing_key, public_key_b64
from app.audit.models import AuditEvent
from app.audit.schemas import (
    AnchorOut,
    AuditEventNamedOut,
    AuditEventOut,
    AuditNamedList,
    PersonOut,
    ProblemOut,
    VerificationOut,
)
from app.db import begin_writing, session_scope
from app.deps import AuditorDep, PageDep, SessionDep, SettingsDep, stream_items
from app.errors import NotFound, raises
from app.fields import UUID_PATTERN, Timestamp
from app.routing import api_router

router = api_router("audit")

_FIELDS = list(AuditEventOut.model_fields)


@router.get("/audit", response_model=AuditNamedList)
def list_events(
    caller: AuditorDep,
    db: SessionDep,
    page: PageDep,
    actor_id: Annotated[str | None, Query(pattern=UUID_PATTERN)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    outcome: Annotated[str | None, Query(max_length=16)] = None,
    subject_id: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[Timestamp | None, Query()] = None,
    until: Annotated[Timestamp | None, Query()] = None,
) -> AuditNamedList:
    """Events, newest first, filtered; with the names their actors and subjects have now."""
    items, total = service.query(
        db,
        actor_id=actor_id,
        action=action,
        outcome=outcome,
        subject_id=subject_id,
        since=since,
        until=until,
        page=page,
    )
    found = names.resolve(db, items)
    return AuditNamedList(items=[_named(e, found) for e in items], total=total)


def _named(event: AuditEvent, found: names.Names) -> AuditEventNamedOut:
    actor = found.actor(event)
    subject_name, subject_email = found.subject(event)
    return AuditEventNamedOut(
        **AuditEventOut.model_validate(event).model_dump(),
        actor=PersonOut(email=actor.email, display_name=actor.display_name) if actor else None,
        subject_name=subject_name,
        subject_email=subject_email,
    )


@router.get("/audit/verify", response_model=VerificationOut)
def verify_chain(caller: AuditorDep, db: SessionDep, settings: SettingsDep) -> VerificationOut:
    """Recompute the keyed chain and check it against the newest signed anchor."""
    result = service.verify(db, settings=settings)
    return VerificationOut(
        ok=result.ok,
        count=result.count,
        first_bad_seq=result.first_bad_seq,
        anchored_seq=result.anchored_seq,
        problems=[
            ProblemOut(kind=p.kind, first_seq=p.first_seq, last_seq=p.last_seq, detail=p.detail)
            for p in result.problems
        ],
    )


@router.get("/audit/anchor", response_model=AnchorOut)
@raises(NotFound)
def newest_anchor(caller: AuditorDep, settings: SettingsDep) -> AnchorOut:
    """The newest signed head of the chain, as kept outside the database."""
    anchor = service.newest_anchor(settings=settings)
    public_key = public_key_b64(anchor_signing_key(settings).public_key())
    return AnchorOut(**asdict(anchor), public_key=public_key)


@router.get(
    "/audit/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Every event in chain order: one JSON object a line (jsonl), or CSV "
            "with a header row (details as a JSON string)",
            "content": {
                "application/x-ndjson": {"schema": {"type": "string"}},
                "text/csv": {"schema": {"type": "string"}},
            },
        }
    },
)
def export(
    caller: AuditorDep,
    request: Request,
    db: SessionDep,
    format: Literal["jsonl", "csv"] = "jsonl",
) -> StreamingResponse:
    """The whole log in chain order, streamed as JSON lines or CSV."""
    begin_writing(db)  # a GET that writes: the export itself is an audited event
    service.record(db, actor=caller.actor, action="audit.export", details={"format": format})
    db.commit()  # the request's session is idle from here; the stream reads with its own
    factory = request.app.state.read_sessionmaker

    def rows() -> Iterator[str]:
        for db in session_scope(factory):
            if format == "csv":
                buf = io.StringIO()
                writer = csv.DictWriter(buf, fieldnames=_FIELDS)
                writer.writeheader()
                yield buf.getvalue()
            for event in service.iter_all(db):
                data = AuditEventOut.model_validate(event).model_dump(mode="json")
                if format == "jsonl":
                    yield json.dumps(data, sort_keys=True) + "\n"
                else:
                    buf = io.StringIO()
                    data["details"] = json.dumps(data["details"], sort_keys=True)
                    csv.DictWriter(buf, fieldnames=_FIELDS).writerow(data)
                    yield buf.getvalue()

    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    headers = {"Content-Disposition": f'attachment; filename="nebula-audit.{format}"'}
    return StreamingResponse(stream_items(request, rows()), media_type=media, headers=headers)

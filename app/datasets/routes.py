"""HTTP routes of datasets (upload, metadata, download, changes) and the catalog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import Query, Request, status
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from app.accounts.models import Identity, User
from app.clusters.service import ANY_CLUSTER
from app.datasets import hf_export
from app.datasets import service as datasets
from app.datasets.schemas import DatasetList, DatasetOut, DatasetUpdateIn
from app.datasets.upload import UploadForm
from app.deps import CallerDep, PageDep, SessionDep, SettingsDep, WriterDep
from app.errors import Conflict, Forbidden, InsufficientStorage, Invalid, QuotaExceeded, raises
from app.grants import residency
from app.jobs import service as jobs
from app.path_params import DatasetIdPath, WorkspaceIdPath
from app.releases import service as releases
from app.routing import api_router
from app.workspaces.models import Dataset, DatasetKind

# the tag the datasets' operations have always had in the OpenAPI document (a contract)
router = api_router("workspaces")

BINARY = {"type": "string", "format": "binary"}


def _datasets_out(db: Session, viewer: User | Identity, items: list[Dataset]) -> list[DatasetOut]:
    """Datasets with what `viewer` may see of their provenance and release."""
    found = releases.derivations(db, viewer=viewer, items=items)

    def allowed(dataset: Dataset) -> list[str] | str:
        # the viewer's grant on another's dataset, or their own derived data's sources' grants
        grants = residency.allowances(db, user_id=viewer.id, dataset_ids=[dataset.id])
        clusters = residency.allowed_clusters(grants)
        return sorted(clusters) if clusters is not None else ANY_CLUSTER

    return [
        DatasetOut.model_validate(d).model_copy(
            update={
                "derived_from": found[d.id].derived_from,
                "release": found[d.id].release.value,
                "derived_by_job_id": found[d.id].job_id,
                "derived_from_names": found[d.id].source_names,
                "default_clusters": d.default_clusters or ANY_CLUSTER,
                "allowed_clusters": allowed(d),
            }
        )
        for d in items
    ]


UPLOAD_BATCH_BYTES = 1024 * 1024  # body bytes handed to the worker thread at a time
UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "name", "kind"],
                    "properties": {
                        "file": {
                            **BINARY,
                            "description": "text: UTF-8 lines; parallel: UTF-8 source<TAB>target "
                            "lines; model: a Nebula safetensors checkpoint, or a tar (plain "
                            "or gzip) of a Hugging Face folder (config.json, safetensors "
                            "weights, tokenizer)",
                        },
                        "name": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 200,
                            "pattern": datasets.NAME_PATTERN,
                        },
                        "kind": {"type": "string", "enum": [k.value for k in DatasetKind]},
                        "discoverable": {"type": "boolean", "default": False},
                    },
                }
            }
        },
    }
}


@router.post(
    "/workspaces/{workspace_id}/datasets",
    response_model=DatasetOut,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=UPLOAD_BODY,
)
@raises(Invalid, QuotaExceeded, InsufficientStorage)
async def upload_dataset(
    workspace_id: WorkspaceIdPath,
    request: Request,
    caller: WriterDep,
    db: SessionDep,
    settings: SettingsDep,
) -> DatasetOut:
    """Upload a file (multipart: file, name, kind, discoverable), streamed and encrypted to disk."""
    # off the event loop, the user row's load included: it waits on the write lock, which
    # another upload's thread may hold while it needs the loop to finish
    plan = await run_in_threadpool(
        lambda: datasets.begin_upload(
            db, actor=caller.actor, user=caller.user, workspace_id=workspace_id, settings=settings
        )
    )
    incoming = await run_in_threadpool(datasets.IncomingFile, plan)
    try:
        form = UploadForm(request.headers.get("content-type", ""), incoming)
        batch = bytearray()
        async for data in request.stream():
            batch += data
            if len(batch) >= UPLOAD_BATCH_BYTES:
                # parse, hash, validate and encrypt off the event loop
                await run_in_threadpool(form.write, bytes(batch))
                batch.clear()
        if batch:
            await run_in_threadpool(form.write, bytes(batch))
        fields = datasets.parse_fields(form.finish())
        await run_in_threadpool(incoming.complete, fields.kind)
        dataset = await run_in_threadpool(
            datasets.finish_upload,
            db,
            actor=caller.actor,
            plan=plan,
            incoming=incoming,
            fields=fields,
        )
    except ClientDisconnect:
        # the client went away, or the body outgrew the limit (already answered 413)
        raise Invalid("the upload was interrupted") from None
    finally:
        await run_in_threadpool(incoming.discard)
    return DatasetOut.model_validate(dataset)


@router.get("/workspaces/{workspace_id}/datasets", response_model=DatasetList)
def list_datasets(
    workspace_id: WorkspaceIdPath, caller: CallerDep, db: SessionDep, page: PageDep
) -> DatasetList:
    """The datasets of one of the caller's workspaces."""
    items, total = datasets.list_in_workspace(
        db, actor=caller.actor, user=caller.identity, workspace_id=workspace_id, page=page
    )
    return DatasetList(items=_datasets_out(db, caller.identity, items), total=total)


@router.get("/datasets/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: DatasetIdPath, caller: CallerDep, db: SessionDep) -> DatasetOut:
    """Metadata with provenance and release state, for the owner or an active grantee."""
    dataset = datasets.get_visible(db, actor=caller.actor, user=caller.user, dataset_id=dataset_id)
    return _datasets_out(db, caller.identity, [dataset])[0]


@router.get(
    "/datasets/{dataset_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {"schema": BINARY}}}},
)
@raises(Forbidden, Conflict, Invalid)
def get_dataset_content(
    dataset_id: DatasetIdPath,
    caller: CallerDep,
    db: SessionDep,
    settings: SettingsDep,
    format: Annotated[
        Literal["raw", "huggingface"],
        Query(
            description="raw: the bytes as uploaded or stored; huggingface: a Nebula-trained "
            "ELECTRA model as a tar of a Hugging Face folder (409 for other models)"
        ),
    ] = "raw",
) -> StreamingResponse:
    """The bytes, decrypted as they stream, for the owner only: grants allow use, not download."""
    dataset = datasets.get_owned(
        db, actor=caller.actor, user=caller.user, dataset_id=dataset_id, action="dataset.download"
    )
    if format == "huggingface" and dataset.kind != DatasetKind.model:
        raise Invalid("only a model dataset exports to Hugging Face")
    reader = datasets.open_for_download(db, actor=caller.actor, dataset=dataset, settings=settings)
    if format == "huggingface":
        export = hf_export.HfExport(reader.iter_chunks(), hf_export.folder_name(reader.name))
        db.commit()  # audited, and known to convert, before the first byte leaves
        return StreamingResponse(
            export.chunks(),
            media_type="application/x-tar",
            headers={
                "content-length": str(export.size),
                "content-disposition": f'attachment; filename="{export.folder}.tar"',
            },
        )
    db.commit()  # the download is audited before the first byte leaves
    chunks = reader.iter_chunks()
    # Authenticate the first chunk before answering 200: a damaged header or first chunk
    # is a clean error; later damage ends the stream early, never with unchecked bytes.
    first = next(chunks, b"")

    def body() -> Iterator[bytes]:
        if first:
            yield first
        yield from chunks

    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers={
            "content-length": str(reader.size_bytes),
            "content-disposition": f'attachment; filename="{reader.dataset_id}.{reader.kind}"',
            "x-content-sha256": reader.sha256,
        },
    )


@router.patch("/datasets/{dataset_id}", response_model=DatasetOut)
@raises(Forbidden, Invalid)
def update_dataset(
    dataset_id: DatasetIdPath, body: DatasetUpdateIn, caller: WriterDep, db: SessionDep
) -> DatasetOut:
    """Rename, switch whether the catalog lists it, or set the clusters approvals allow by
    default (owner)."""
    dataset = datasets.get_owned(
        db, actor=caller.actor, user=caller.user, dataset_id=dataset_id, action="dataset.update"
    )
    datasets.update(
        db,
        actor=caller.actor,
        dataset=dataset,
        name=body.name,
        discoverable=body.discoverable,
        default_clusters=body.default_clusters,
    )
    db.commit()
    return _datasets_out(db, caller.identity, [dataset])[0]


@router.delete("/datasets/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT)
@raises(Forbidden)
def delete_dataset(
    dataset_id: DatasetIdPath, caller: WriterDep, db: SessionDep, settings: SettingsDep
) -> None:
    """Delete (owner): the quota is given back, requests and grants on it end."""
    dataset = datasets.get_owned(
        db, actor=caller.actor, user=caller.user, dataset_id=dataset_id, action="dataset.delete"
    )
    ended = datasets.delete(db, actor=caller.actor, dataset=dataset)
    db.commit()
    datasets.remove_file(settings, dataset.id)
    jobs.stop_jobs_of_ended_grants(db, ended=ended)
    db.commit()


@router.get("/catalog", response_model=DatasetList)
def get_catalog(
    caller: CallerDep,
    db: SessionDep,
    page: PageDep,
    q: Annotated[str | None, Query(max_length=200)] = None,
    kind: DatasetKind | None = None,
) -> DatasetList:
    """Metadata of the datasets their owners made discoverable, to request access to."""
    entries, total = datasets.catalog(db, viewer_id=caller.user_id, q=q, kind=kind, page=page)
    items = [
        out.model_copy(
            update={"owner_display_name": entry.owner_display_name, "sha256": entry.sha256}
        )
        for out, entry in zip(
            _datasets_out(db, caller.identity, [e.dataset for e in entries]), entries, strict=True
        )
    ]
    return DatasetList(items=items, total=total)

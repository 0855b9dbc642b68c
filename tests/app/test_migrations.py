"""The Alembic migrations and the ORM models describe the same schema, on both databases."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import delete, func, select

from app.db import make_engine
from app.migrate import alembic_config, downgrade, upgrade
from app.models import Base
from app.releases.models import DatasetSource
from app.releases.provenance import Input, needs_release, record_sources, sources_of
from app.seals import TamperedRow
from app.settings import Settings
from app.workspaces.models import Dataset, DatasetKind
from support.platforms import Platform

PROVENANCE = "0007"
SOURCES_DIGEST = "0016"  # the revision that binds each derived dataset's list of sources
SEALS = "0012"  # the revision that seals the rows that confer access  # the revision that brings dataset_sources and release requests


def _drift(url: str) -> list[object]:
    engine = make_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return list(diff)


def test_models_and_migrations_agree(database_url: str) -> None:
    assert _drift(database_url) == []


def test_migrations_go_down_and_up_again(database_url: str) -> None:
    downgrade(database_url, "base")
    assert _drift(database_url) != []  # everything is gone
    upgrade(database_url)
    assert _drift(database_url) == []


def test_going_below_provenance_refuses_while_outputs_are_bound_to_others_data(
    database_url: str, platform: Platform, settings: Settings
) -> None:
    alice, bob = platform.user(), platform.user()
    with platform.factory() as db:
        text, model = (
            Dataset(owner_id=owner.id, name=name, kind=kind, size_bytes=1, sha256="0" * 64)
            for owner, name, kind in (
                (alice, "text", DatasetKind.text),
                (bob, "m", DatasetKind.model),
            )
        )
        db.add_all([text, model])
        db.flush()
        db.add(
            DatasetSource(
                dataset_id=model.id,
                source_id=text.id,
                source_owner_id=alice.id,
                direct=True,
                job_id="job",
            )
        )
        db.commit()
    below = ScriptDirectory.from_config(alembic_config(database_url)).get_revision(PROVENANCE)
    assert below is not None and isinstance(below.down_revision, str)
    with pytest.raises(RuntimeError, match="bind job outputs to other owners' data"):
        downgrade(database_url, below.down_revision, settings=settings)
    # revisions above PROVENANCE may have gone down before it refused (SQLite runs each
    # migration's DDL on its own); up again, the schema is whole and no source was lost
    upgrade(database_url, settings=settings)
    assert _drift(database_url) == []
    with platform.factory() as db:
        assert db.scalar(select(func.count()).select_from(DatasetSource)) == 1
    with platform.factory() as db:
        db.execute(delete(DatasetSource))
        db.commit()
    downgrade(database_url, below.down_revision, settings=settings)
    upgrade(database_url, settings=settings)
    assert _drift(database_url) == []


def test_upgrading_seals_the_rows_already_there_with_the_platforms_key(
    database_url: str, client: TestClient, platform: Platform, settings: Settings
) -> None:
    """0012 seals existing rows (app/seals.py) under the secret of the settings it is given."""
    alice = platform.user()
    workspace = client.get("/api/v1/workspaces", headers=alice.headers).json()["items"][0]["id"]
    uploaded = client.post(
        f"/api/v1/workspaces/{workspace}/datasets",
        data={"name": "t", "kind": "text"},
        files={"file": ("f", b"one line\n")},
        headers=alice.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    content = f"/api/v1/datasets/{uploaded.json()['id']}/content"
    seals = ScriptDirectory.from_config(alembic_config(database_url)).get_revision(SEALS)
    assert seals is not None and isinstance(seals.down_revision, str)
    downgrade(database_url, seals.down_revision, settings=settings)
    upgrade(database_url, settings=settings)
    assert client.get(content, headers=alice.headers).content == b"one line\n"
    # sealed under another secret, the rows are refused: the key is the platform's alone
    downgrade(database_url, seals.down_revision, settings=settings)
    other = settings.model_copy(update={"secret_key": SecretStr("another-secret")})
    upgrade(database_url, settings=other)
    assert client.get(content, headers=alice.headers).status_code == 404


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_root_writes_the_first_anchor_as_the_owner_of_the_var_folder(
    database_url: str, settings: Settings
) -> None:
    """nebula-migrate.service runs `nebula db upgrade` as root (to read the owner's
    password): the first anchor and its key must still be the API user's to append to."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to become the var folder's owner")
    nobody = 65534
    root = Path(tempfile.mkdtemp(prefix="nebula-migrate-"))
    try:
        root.chmod(0o755)
        var = root / "var"
        var.mkdir(mode=0o700)
        os.chown(var, nobody, nobody)
        upgrade(
            database_url,
            settings=settings.model_copy(
                update={"var_dir": var, "data_dir": None, "audit_anchor_key_file": None}
            ),
        )
        written = [var / "audit_anchor_key", var / "data" / "audit" / "anchors.jsonl"]
        assert all(path.stat().st_uid == nobody for path in written)
        assert all(path.stat().st_uid == nobody for path in var.rglob("*"))
    finally:
        shutil.rmtree(root)


def test_upgrading_binds_the_sources_of_datasets_already_derived(
    database_url: str, platform: Platform, settings: Settings
) -> None:
    """0016 computes `sources_digest` for existing derived datasets and seals them again."""
    alice, bob = platform.user(), platform.user()
    with platform.factory() as db:
        text = Dataset(
            owner_id=alice.id, name="t", kind=DatasetKind.text, size_bytes=1, sha256="0" * 64
        )
        model = Dataset(
            owner_id=bob.id, name="m", kind=DatasetKind.model, size_bytes=1, sha256="0" * 64
        )
        db.add_all([text, model])
        db.flush()
        record_sources(db, dataset_id=model.id, job_id="job", inputs=[Input(text, None)])
        db.commit()
        model_id = model.id
    digest = ScriptDirectory.from_config(alembic_config(database_url)).get_revision(SOURCES_DIGEST)
    assert digest is not None and isinstance(digest.down_revision, str)
    downgrade(database_url, digest.down_revision, settings=settings)
    upgrade(database_url, settings=settings)
    assert _drift(database_url) == []
    with platform.factory() as db:
        derived = db.get(Dataset, model_id)  # its seal holds over the new field list
        assert derived is not None and derived.sources_digest is not None
        assert [s.source_id for s in sources_of(db, model_id)] == [text.id]
        assert needs_release(db, derived)
    with platform.factory() as db:
        db.execute(delete(DatasetSource))
        db.commit()
    with platform.factory() as db, pytest.raises(TamperedRow):
        sources_of(db, model_id)

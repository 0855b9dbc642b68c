"""Imports every ORM model so that Base.metadata knows the whole schema (Alembic, tests)."""

from app.accounts.models import AuthToken, LoginFailure, User
from app.audit.models import AuditEvent
from app.clusters.models import Certificate, Cluster, EnrollmentToken, PlatformKey
from app.db import Base
from app.grants.models import AccessRequest
from app.jobs.models import ColumnExposure, Job, JobArtifact, JobMetric, JobRole
from app.releases.models import DatasetSource, ReleaseApproval, ReleaseRequest
from app.workspaces.models import Dataset, Workspace

__all__ = [
    "AccessRequest",
    "AuditEvent",
    "AuthToken",
    "Base",
    "Certificate",
    "Cluster",
    "ColumnExposure",
    "Dataset",
    "DatasetSource",
    "EnrollmentToken",
    "Job",
    "JobArtifact",
    "JobMetric",
    "JobRole",
    "LoginFailure",
    "PlatformKey",
    "ReleaseApproval",
    "ReleaseRequest",
    "User",
    "Workspace",
]

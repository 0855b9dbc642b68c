"""The path parameters of the API: ids and serials, each stating in the OpenAPI document what
it accepts. HTTP only, so apart from app/fields.py, which schemas (and through them services)
import."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from app.fields import EXAMPLE_ID, UUID_PATTERN


def id_path(resource: str) -> Any:
    """The path parameter naming one `resource` by its id."""
    return Path(
        min_length=36,
        max_length=36,
        pattern=UUID_PATTERN,
        description=f"The {resource}'s id",
        examples=[EXAMPLE_ID],
    )


UserIdPath = Annotated[str, id_path("user")]
TokenIdPath = Annotated[str, id_path("API token")]
WorkspaceIdPath = Annotated[str, id_path("workspace")]
DatasetIdPath = Annotated[str, id_path("dataset")]
RequestIdPath = Annotated[str, id_path("access request")]
ReleaseIdPath = Annotated[str, id_path("release request")]
ClusterIdPath = Annotated[str, id_path("cluster")]
JobIdPath = Annotated[str, id_path("job")]
CredentialIdPath = Annotated[str, id_path("worker credential")]
# Serials are kept as decimal strings (63 random bits, app.pki.ca.new_serial).
SerialPath = Annotated[
    str,
    Path(pattern=r"^[0-9]{1,64}$", description="Certificate serial, decimal", examples=["42"]),
]

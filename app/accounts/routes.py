"""HTTP routes of accounts: login, me, tokens, users (admin)."""

from __future__ import annotations

from fastapi import Request, Response, status
from sqlalchemy.orm import Session

from app.accounts import quotas, service
from app.accounts.models import User
from app.accounts.schemas import (
    LoginIn,
    LoginOut,
    PasswordChangeIn,
    TokenCreatedOut,
    TokenCreateIn,
    TokenList,
    TokenOut,
    UserCreateIn,
    UserList,
    UserOut,
    UserQuotaIn,
    UserQuotaOut,
    UserUpdateIn,
)
from app.accounts.tokens import csrf_token
from app.audit import service as audit
from app.audit.schemas import AuditEventOut, AuditList
from app.deps import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    AdminDep,
    CallerDep,
    PageDep,
    SessionDep,
    SettingsDep,
    client_ip,
)
from app.errors import Conflict, Invalid, NotAuthenticated, TooManyAttempts, raises
from app.fields import TokenIdPath, UserIdPath
from app.jobs import service as jobs
from app.keyring import Purpose, subkey
from app.routing import api_router
from app.settings import Settings

router = api_router("accounts")


@router.post("/auth/login", response_model=LoginOut)
@raises(NotAuthenticated, TooManyAttempts)
def login(
    body: LoginIn, request: Request, response: Response, db: SessionDep, settings: SettingsDep
) -> LoginOut:
    """Exchange email and password for a session token (also set as cookies)."""
    user, issued = service.login(
        db, email=body.email, password=body.password, ip=client_ip(request), settings=settings
    )
    db.commit()
    max_age = settings.session_ttl_hours * 3600
    secure = settings.cookie_secure or request.url.scheme == "https"
    response.set_cookie(
        SESSION_COOKIE,
        issued.secret,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    response.set_cookie(
        CSRF_COOKIE,
        csrf_token(subkey(settings, Purpose.csrf), issued.secret),
        max_age=max_age,
        httponly=False,
        samesite="strict",
        secure=secure,
        path="/",
    )
    return LoginOut(
        token=issued.secret, expires_at=issued.record.expires_at, user=UserOut.model_validate(user)
    )


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def logout(caller: CallerDep, db: SessionDep) -> Response:
    """End the current session (or API token) at once."""
    service.revoke_token(db, actor=caller.actor, record=caller.token)
    db.commit()
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


@router.get("/me", response_model=UserOut)
def me(caller: CallerDep) -> UserOut:
    """Who is signed in."""
    return UserOut.model_validate(caller.user)


@router.post("/me/password", status_code=status.HTTP_204_NO_CONTENT)
@raises(Invalid, TooManyAttempts)
def change_password(
    body: PasswordChangeIn, caller: CallerDep, db: SessionDep, settings: SettingsDep
) -> None:
    """Change the password; every other session and token is revoked."""
    service.change_password(
        db,
        actor=caller.actor,
        user=caller.user,
        current_token=caller.token,
        current_password=body.current_password,
        new_password=body.new_password,
        settings=settings,
    )
    db.commit()


@router.post("/me/tokens", response_model=TokenCreatedOut, status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreateIn, caller: CallerDep, db: SessionDep) -> TokenCreatedOut:
    """A new API token; the secret is in this answer only."""
    issued = service.create_api_token(
        db,
        actor=caller.actor,
        user=caller.user,
        name=body.name,
        expires_in_days=body.expires_in_days,
    )
    db.commit()
    return TokenCreatedOut(
        **TokenOut.model_validate(issued.record).model_dump(), token=issued.secret
    )


@router.get("/me/tokens", response_model=TokenList)
def list_tokens(caller: CallerDep, db: SessionDep, page: PageDep) -> TokenList:
    """The caller's API tokens, without secrets."""
    items, total = service.list_api_tokens(db, user=caller.user, page=page)
    return TokenList(items=[TokenOut.model_validate(t) for t in items], total=total)


@router.delete("/me/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: TokenIdPath, caller: CallerDep, db: SessionDep) -> None:
    """Revoke one of the caller's API tokens."""
    record = service.get_own_api_token(db, actor=caller.actor, user=caller.user, token_id=token_id)
    service.revoke_token(db, actor=caller.actor, record=record)
    db.commit()


@router.get("/me/audit", response_model=AuditList)
def my_audit(caller: CallerDep, db: SessionDep, page: PageDep) -> AuditList:
    """Audit events where the caller is the actor or the subject."""
    items, total = audit.query(db, involving_user=caller.user_id, page=page)
    return AuditList(items=[AuditEventOut.model_validate(e) for e in items], total=total)


@router.post("/users", response_model=UserOut, status_code=status.HTTP_201_CREATED)
@raises(Conflict, Invalid)
def create_user(
    body: UserCreateIn, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> UserOut:
    """Create a user (and their personal workspace)."""
    user = service.create_user(
        db,
        actor=caller.actor,
        email=body.email,
        display_name=body.display_name,
        role=body.role,
        password=body.password,
        settings=settings,
    )
    db.commit()
    return UserOut.model_validate(user)


@router.get("/users", response_model=UserList)
def list_users(caller: AdminDep, db: SessionDep, page: PageDep) -> UserList:
    """Every user."""
    items, total = service.list_users(db, page=page)
    return UserList(items=[UserOut.model_validate(u) for u in items], total=total)


@router.get("/users/{user_id}", response_model=UserOut)
def get_user(user_id: UserIdPath, caller: AdminDep, db: SessionDep) -> UserOut:
    """One user."""
    return UserOut.model_validate(service.get_user(db, user_id=user_id))


@router.patch("/users/{user_id}", response_model=UserOut)
@raises(Conflict)
def update_user(
    user_id: UserIdPath, body: UserUpdateIn, caller: AdminDep, db: SessionDep
) -> UserOut:
    """Change display name or role."""
    user = service.update_user(
        db,
        actor=caller.actor,
        user=service.get_user(db, user_id=user_id),
        display_name=body.display_name,
        role=body.role,
    )
    db.commit()
    return UserOut.model_validate(user)


def _quota_out(db: Session, user: User, settings: Settings) -> UserQuotaOut:
    now = quotas.usage(db, user=user, settings=settings)
    return UserQuotaOut(
        max_workspaces=now.quota.max_workspaces,
        storage_bytes_limit=now.quota.storage_bytes_limit,
        max_concurrent_jobs=now.quota.max_concurrent_jobs,
        roles_per_cluster=now.quota.roles_per_cluster,
        workspaces=now.workspaces,
        storage_bytes_used=now.storage_bytes_used,
        active_jobs=now.active_jobs,
    )


@router.get("/users/{user_id}/quota", response_model=UserQuotaOut)
def get_user_quota(
    user_id: UserIdPath, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> UserQuotaOut:
    """A user's limits over all their workspaces, and their use of them."""
    return _quota_out(db, service.get_user(db, user_id=user_id), settings)


@router.patch("/users/{user_id}/quota", response_model=UserQuotaOut)
def set_user_quota(
    user_id: UserIdPath, body: UserQuotaIn, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> UserQuotaOut:
    """Set a user's limits on workspaces, storage, concurrent jobs and role slots per cluster
    (admins)."""
    user = quotas.set_quota(
        db,
        actor=caller.actor,
        user=service.get_user(db, user_id=user_id),
        max_workspaces=body.max_workspaces,
        storage_bytes_limit=body.storage_bytes_limit,
        max_concurrent_jobs=body.max_concurrent_jobs,
        roles_per_cluster=body.roles_per_cluster,
    )
    db.commit()
    return _quota_out(db, user, settings)


@router.post("/users/{user_id}/suspend", response_model=UserOut)
@raises(Conflict)
def suspend_user(user_id: UserIdPath, caller: AdminDep, db: SessionDep) -> UserOut:
    """Suspend: all sessions and tokens die at once."""
    user = service.get_user(db, user_id=user_id)
    service.suspend(db, actor=caller.actor, user=user)
    db.commit()
    return UserOut.model_validate(user)


@router.post("/users/{user_id}/reactivate", response_model=UserOut)
@raises(Conflict)
def reactivate_user(user_id: UserIdPath, caller: AdminDep, db: SessionDep) -> UserOut:
    """Let a suspended user in again."""
    user = service.get_user(db, user_id=user_id)
    service.reactivate(db, actor=caller.actor, user=user)
    db.commit()
    return UserOut.model_validate(user)


@router.delete("/users/{user_id}", status_code=status.HTTP_204_NO_CONTENT)
@raises(Conflict)
def delete_user(user_id: UserIdPath, caller: AdminDep, db: SessionDep) -> None:
    """Mark a user deleted; the audit trail stays."""
    ended = service.delete_user(db, actor=caller.actor, user=service.get_user(db, user_id=user_id))
    db.commit()
    jobs.stop_jobs_of_ended_grants(db, ended=ended)
    db.commit()

"""HTTP routes of accounts: login, me, tokens, users (admin)."""

from __future__ import annotations

from html import escape
from typing import Annotated

from fastapi import Query, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from app.accounts import mail, oidc, quotas, recovery, second_factor, service
from app.accounts.models import Role, User
from app.accounts.schemas import (
    ForgotPasswordIn,
    ForgotPasswordOut,
    LoginIn,
    LoginOut,
    OidcInfoOut,
    PasswordChangeIn,
    PasswordResetIn,
    ResetLinkOut,
    TokenCreatedOut,
    TokenCreateIn,
    TokenList,
    TokenOut,
    TotpCodeIn,
    TotpConfirmOut,
    TotpEnrolIn,
    TotpEnrolOut,
    TotpStatusOut,
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
    EnrollingCallerDep,
    PageDep,
    SessionDep,
    SettingsDep,
    client_ip,
)
from app.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    NotAuthenticated,
    TooManyAttempts,
    raises,
)
from app.jobs import service as jobs
from app.keyring import Purpose, subkey
from app.path_params import TokenIdPath, UserIdPath
from app.routing import api_router
from app.settings import Settings

router = api_router("accounts")


OIDC_STATE_COOKIE = "nebula_oidc_state"
OIDC_COOKIE_PATH = "/api/v1/auth/oidc"


def _set_session_cookies(
    response: Response, request: Request, secret: str, settings: Settings
) -> None:
    max_age = settings.session_ttl_hours * 3600
    secure = settings.cookie_secure or request.url.scheme == "https"
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    response.set_cookie(
        CSRF_COOKIE,
        csrf_token(subkey(settings, Purpose.csrf), secret),
        max_age=max_age,
        httponly=False,
        samesite="strict",
        secure=secure,
        path="/",
    )


@router.post("/auth/login", response_model=LoginOut)
@raises(NotAuthenticated, Forbidden, TooManyAttempts)
def login(
    body: LoginIn, request: Request, response: Response, db: SessionDep, settings: SettingsDep
) -> LoginOut:
    """Exchange email and password for a session token (also set as cookies)."""
    user, issued = service.login(
        db,
        email=body.email,
        password=body.password,
        otp=body.otp,
        ip=client_ip(request),
        settings=settings,
    )
    db.commit()
    _set_session_cookies(response, request, issued.secret, settings)
    return LoginOut(
        token=issued.secret, expires_at=issued.record.expires_at, user=UserOut.model_validate(user)
    )


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def logout(caller: EnrollingCallerDep, db: SessionDep) -> Response:
    """End the current session (or API token) at once."""
    service.revoke_token(db, actor=caller.actor, record=caller.token)
    db.commit()
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


@router.get("/auth/oidc", response_model=OidcInfoOut)
def oidc_info(settings: SettingsDep) -> OidcInfoOut:
    """Whether single sign-on is on, the provider's name, and whether passwords still work."""
    return OidcInfoOut(
        enabled=oidc.enabled(settings),
        provider_name=settings.oidc_provider_name,
        password_login=not settings.require_sso,
    )


def _sso_page(status_code: int, message: str) -> HTMLResponse:
    """A short page for a refused sign-in: the browser came from the provider, not the UI."""
    body = (
        "<!doctype html><html lang=en><meta charset=utf-8><title>Sign-in refused</title>"
        "<main><h1>Sign-in refused</h1>"
        f"<p id=reason>{escape(message[:1].upper() + message[1:])}.</p>"
        "<p><a href=/>Back to sign in</a></p></main></html>"
    )
    page = HTMLResponse(body, status_code=status_code)
    page.headers["Cache-Control"] = "no-store"
    page.delete_cookie(OIDC_STATE_COOKIE, path=OIDC_COOKIE_PATH)
    return page


# The two browser legs of single sign-on answer redirects and pages, not JSON: they are
# for browsers, not API clients, and stay out of the OpenAPI document.
@router.get("/auth/oidc/login", include_in_schema=False)
def oidc_login(request: Request, db: SessionDep, settings: SettingsDep) -> Response:
    """Send the browser to the identity provider (authorization code flow with PKCE)."""
    if not oidc.enabled(settings):
        return _sso_page(404, "single sign-on is not configured on this platform")
    try:
        url, state = oidc.begin(db, settings=settings)
    except oidc.SignInRefused as refusal:
        return _sso_page(refusal.status, refusal.message)
    db.commit()
    answer = RedirectResponse(url, status_code=302)
    answer.set_cookie(
        OIDC_STATE_COOKIE,
        state,
        max_age=settings.oidc_login_minutes * 60,
        httponly=True,
        # Lax: the provider's redirect back is a top-level navigation from another site
        samesite="lax",
        secure=settings.cookie_secure or request.url.scheme == "https",
        path=OIDC_COOKIE_PATH,
    )
    return answer


@router.get("/auth/oidc/callback", include_in_schema=False)
def oidc_callback(
    request: Request,
    db: SessionDep,
    settings: SettingsDep,
    state: Annotated[str, Query(max_length=512)] = "",
    code: Annotated[str, Query(max_length=4096)] = "",
    error: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """Where the provider sends the browser back: a session and the workspaces, or a page
    that says why not (every outcome audited with the provider and the subject)."""
    if not oidc.enabled(settings):
        return _sso_page(404, "single sign-on is not configured on this platform")
    if error:
        return _sso_page(401, "the identity provider did not sign you in")
    try:
        _user, issued = oidc.finish(
            db,
            state=state,
            state_cookie=request.cookies.get(OIDC_STATE_COOKIE, ""),
            code=code,
            ip=client_ip(request),
            settings=settings,
        )
    except oidc.SignInRefused as refusal:
        return _sso_page(refusal.status, refusal.message)
    db.commit()
    answer = RedirectResponse("/workspaces", status_code=303)
    _set_session_cookies(answer, request, issued.secret, settings)
    answer.delete_cookie(OIDC_STATE_COOKIE, path=OIDC_COOKIE_PATH)
    return answer


@router.post(
    "/auth/forgot-password",
    response_model=ForgotPasswordOut,
    status_code=status.HTTP_202_ACCEPTED,
)
@raises(TooManyAttempts)
def forgot_password(
    body: ForgotPasswordIn, request: Request, db: SessionDep, settings: SettingsDep
) -> ForgotPasswordOut:
    """Mail a reset link if the address has an account; the answer is the same either way."""
    outgoing = recovery.request_reset(
        db, email=body.email, ip=client_ip(request), settings=settings
    )
    db.commit()
    if outgoing is not None:
        mail.send_later(outgoing, settings)  # a thread of its own: no slower than no mail
    return ForgotPasswordOut(detail=recovery.FORGOT_ANSWER)


@router.post("/auth/reset-password", status_code=status.HTTP_204_NO_CONTENT)
@raises(BadRequest, Invalid, TooManyAttempts)
def reset_password(
    body: PasswordResetIn, request: Request, db: SessionDep, settings: SettingsDep
) -> None:
    """Set a new password with a reset link's token; every session of the account ends."""
    recovery.reset_password(
        db,
        secret=body.token,
        new_password=body.new_password,
        ip=client_ip(request),
        settings=settings,
    )
    db.commit()


@router.get("/me", response_model=UserOut)
def me(caller: EnrollingCallerDep) -> UserOut:
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
@raises(Forbidden, TooManyAttempts)
def create_token(
    body: TokenCreateIn, caller: CallerDep, db: SessionDep, settings: SettingsDep
) -> TokenCreatedOut:
    """A new API token; the secret is in this answer only. With a second factor: `otp` too."""
    issued = service.create_api_token(
        db,
        actor=caller.actor,
        user=caller.user,
        name=body.name,
        expires_in_days=body.expires_in_days,
        otp=body.otp,
        settings=settings,
    )
    db.commit()
    return TokenCreatedOut(
        **TokenOut.model_validate(issued.record).model_dump(), token=issued.secret
    )


def _totp_status(db: Session, caller_user: User, settings: Settings) -> TotpStatusOut:
    enrolled, left = second_factor.status(db, user=caller_user)
    required = settings.require_admin_totp and caller_user.role == Role.admin
    return TotpStatusOut(enrolled=enrolled, recovery_codes_left=left, required=required)


@router.get("/me/totp", response_model=TotpStatusOut)
def totp_status(caller: EnrollingCallerDep, db: SessionDep, settings: SettingsDep) -> TotpStatusOut:
    """Whether the caller has a second factor, and how many recovery codes remain."""
    return _totp_status(db, caller.user, settings)


@router.post("/me/totp", response_model=TotpEnrolOut, status_code=status.HTTP_201_CREATED)
@raises(Conflict, Invalid)
def totp_enrol(
    body: TotpEnrolIn,
    response: Response,
    caller: EnrollingCallerDep,
    db: SessionDep,
    settings: SettingsDep,
) -> TotpEnrolOut:
    """Begin enrolling a TOTP factor: the secret, its otpauth URI and a QR code, shown once."""
    enrolment = second_factor.begin_enrolment(
        db, actor=caller.actor, user=caller.user, secret=body.secret, settings=settings
    )
    db.commit()
    response.headers["Cache-Control"] = "no-store"
    return TotpEnrolOut(
        secret=enrolment.secret, otpauth_uri=enrolment.otpauth_uri, qr_svg=enrolment.qr_svg
    )


@router.post("/me/totp/confirm", response_model=TotpConfirmOut)
@raises(BadRequest, Conflict, TooManyAttempts)
def totp_confirm(
    body: TotpCodeIn,
    response: Response,
    caller: EnrollingCallerDep,
    db: SessionDep,
    settings: SettingsDep,
) -> TotpConfirmOut:
    """Finish enrolling with a code from the app; ten recovery codes, shown once."""
    codes = second_factor.confirm_enrolment(
        db,
        actor=caller.actor,
        user=caller.user,
        token=caller.token,
        code=body.code,
        settings=settings,
    )
    db.commit()
    response.headers["Cache-Control"] = "no-store"
    return TotpConfirmOut(recovery_codes=codes)


@router.post("/me/totp/remove", status_code=status.HTTP_204_NO_CONTENT)
@raises(Conflict, Forbidden, TooManyAttempts)
def totp_remove(body: TotpCodeIn, caller: CallerDep, db: SessionDep, settings: SettingsDep) -> None:
    """Remove the caller's second factor and recovery codes, proven by a code now."""
    second_factor.remove(
        db, actor=caller.actor, user=caller.user, code=body.code, settings=settings
    )
    db.commit()


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


@router.post(
    "/users/{user_id}/reset-link",
    response_model=ResetLinkOut,
    status_code=status.HTTP_201_CREATED,
)
@raises(Conflict)
def issue_reset_link(
    user_id: UserIdPath, response: Response, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> ResetLinkOut:
    """A one-time password reset link for the user, valid 30 minutes; shown this once."""
    issued = recovery.issue_link(
        db, actor=caller.actor, user=service.get_user(db, user_id=user_id), settings=settings
    )
    db.commit()
    response.headers["Cache-Control"] = "no-store"
    return ResetLinkOut(url=issued.url, expires_at=issued.record.expires_at)


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

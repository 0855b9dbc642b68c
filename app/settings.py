"""Typed settings: every knob is a NEBULA_* environment variable; nothing else reads os.environ."""

from __future__ import annotations

import contextlib
import secrets
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.private_files import create_private_file


class Settings(BaseSettings):
    """The platform's configuration."""

    model_config = SettingsConfigDict(env_prefix="NEBULA_", extra="ignore")

    var_dir: Path = Path("./var")
    database_url: str = ""  # empty: sqlite under var_dir
    broker_url: str = ""  # empty: the embedded filesystem broker under var_dir
    # the broker as cluster hosts reach it (bundles put each cluster's own user in it);
    # empty: the same host as broker_url
    cluster_broker_url: str = ""
    # the control plane as cluster hosts reach it, written into bundles
    public_url: str = "http://127.0.0.1:8000"
    data_dir: Path | None = None  # None: var_dir / "data"
    secret_key: SecretStr | None = None  # None: generated into var_dir/secret_key

    session_ttl_hours: int = 12
    max_api_token_days: int = 365
    lockout_failures: int = 5
    lockout_window_minutes: int = 15
    # failed logins from one address within the window before it gets 429 for any account:
    # distinct unknown emails would otherwise each pass their own account's lockout
    login_ip_failures: int = 50
    # argon2id cost; the defaults are argon2-cffi's own (~0.12 s a hash here)
    argon2_time_cost: int = 3
    argon2_memory_kib: int = 65536
    argon2_parallelism: int = 4
    # argon2 computations admitted at once per server process (one runs, the rest wait);
    # beyond that a login answers 429 at once, so a flood of logins cannot starve the API
    password_hash_slots: int = 2

    # admins must sign in with a second factor (TOTP); one without can only enrol one.
    # Off by default so that scripts that sign in with a password keep working
    require_admin_totp: bool = False
    totp_issuer: str = "Nebula"  # the name authenticator apps show for the account
    # OpenID Connect sign-in (authorization code + PKCE); empty issuer: off
    oidc_issuer: str = ""
    oidc_client_id: str = ""
    oidc_client_secret: SecretStr | None = None
    oidc_provider_name: str = "your organisation"  # as in "Sign in with <provider>"
    oidc_scopes: str = "openid email profile"
    # first sign-in of an address with no account: create a member, or refuse (an admin
    # invites by creating the account first)
    oidc_create_users: bool = True
    # the claim that lists a person's groups, and the groups that make admins and auditors
    oidc_groups_claim: str = "groups"
    oidc_admin_group: str = ""
    oidc_auditor_group: str = ""
    oidc_clock_skew_s: int = 60
    oidc_max_id_token_bytes: int = 16 * 1024
    oidc_login_minutes: int = 10  # how long a sign-in may stay at the provider
    oidc_http_timeout_s: float = 10.0
    # password sign-in refused for everyone: accounts sign in through the provider only
    require_sso: bool = False
    # password recovery: one-time links, by an admin or by email ("forgot password")
    reset_link_minutes: int = 30
    # "forgot password" requests per email address, and per client address, in the window
    reset_requests_per_email: int = 3
    reset_requests_per_ip: int = 20
    reset_window_minutes: int = 60
    # the mail server that sends reset links; empty host: no mail is sent (admins issue links)
    smtp_host: str = ""
    smtp_port: int = 587
    smtp_username: str = ""
    smtp_password: SecretStr | None = None
    smtp_from: str = "nebula@localhost"
    smtp_starttls: bool = True  # upgrade with STARTTLS (refused if the server cannot)
    smtp_ssl: bool = False  # implicit TLS from the first byte (port 465)
    smtp_timeout_s: float = 10.0

    default_storage_bytes_limit: int = 10 * 1024**3
    default_max_concurrent_jobs: int = 2
    # per user, over all their workspaces (an admin may set other values per user)
    default_user_max_workspaces: int = 10
    default_user_storage_bytes_limit: int = 50 * 1024**3
    default_user_max_concurrent_jobs: int = 4
    # Fair share of each cluster's workers (app.jobs.fairshare): role slots one tenant may
    # hold on one cluster (replicas count; an admin may set other values per user), a
    # cluster's slots where its admin set none (None: unbounded), and how long a job may
    # wait for its slots before it fails with the reason it waited
    default_roles_per_cluster: int = Field(default=16, ge=1)
    default_cluster_role_slots: int | None = Field(default=None, ge=1)
    queue_timeout_s: float = Field(default=86400.0, gt=0)
    max_request_body_bytes: int = 1024 * 1024  # JSON bodies; uploads have their own limit
    max_upload_bytes: int = 2 * 1024**3

    # worker threads per server process; the database pool holds one connection for each,
    # plus stream_threads for event streams and exports, plus three (readiness probe,
    # reaper, start-up).
    # Requests take turns on the GIL: past a few threads more only contend for it
    # (bench/request_threads.py: 8 serve 1.22x the reads of 40 on SQLite, 1.07x on PostgreSQL)
    thread_pool_size: int = 8
    stream_threads: int = 4
    # threads (and connections) that look up the credential of a signed-in route's request
    # before it takes a slot (app/credential_gate.py): bad tokens wait for these, not slots
    credential_check_threads: int = Field(default=2, ge=1)

    # Slow clients (no login needed) must not hold what complete requests need. A request's
    # head (line and headers) must arrive within request_head_timeout_s of its first byte (of
    # the connection, for the first request), and a JSON body within request_body_timeout_s
    # of the head: both are read before the request takes an admission slot. An upload
    # streams, authenticated first; it gives its slot back while it waits for data, and a
    # pause of upload_idle_timeout_s ends it.
    request_head_timeout_s: float = 10.0
    request_body_timeout_s: float = 10.0
    upload_idle_timeout_s: float = 30.0
    # Per client address, per server process (behind a proxy: the proxy's address; 0 turns
    # a cap off). Connections past the cap are refused at once; requests past the second
    # wait, holding no slot, so that one address never holds more than this many slots.
    max_connections_per_address: int = 64
    max_requests_per_address: int = 4

    # Secure cookies and HSTS go with HTTPS by themselves; set true to force them where a
    # proxy ends TLS and forwards plain HTTP
    cookie_secure: bool = False
    run_reaper: bool = True  # restart stalled job attempts and dispatch pending roles
    reaper_interval_s: float = 2.0
    heartbeat_timeout_s: float = 20.0  # a role silent this long is presumed dead
    role_heartbeat_s: float = 2.0  # how often a role beats through the cluster API
    job_token_ttl_s: float = 300.0  # a job token's life; every heartbeat renews it
    presence_report_s: float = 10.0  # how often switches and workers report in
    presence_timeout_s: float = 30.0  # one silent this long counts as offline
    purge_interval_s: float = 600.0  # the reaper drops expired login failures and tokens
    # how often the audit chain's head is signed into var/data/audit/anchors.jsonl; events
    # newer than the last anchor could be deleted unseen by someone with database rights
    audit_anchor_interval_s: float = 1.0
    # where a write-once copy of every anchor goes: a folder on another mount or host (one
    # O_EXCL file each), or the https:// URL of `nebula audit mirror-serve` on a second
    # host; verify checks the local file against it. Empty: no mirror
    audit_anchor_mirror: str = ""
    # for a URL mirror: the file holding its writer token, and the CA that signed its TLS
    # certificate (None: the system's CAs)
    audit_anchor_mirror_token_file: Path | None = None
    audit_anchor_mirror_ca: Path | None = None
    # the Ed25519 key that signs anchors (PKCS#8 PEM, mode 0600; `nebula audit anchor-key
    # create`). None: var_dir/audit_anchor_key, made at first start (same host: see
    # docs/audit.md, key ceremony). Retired keys' public halves (base64, comma-separated)
    # still verify the anchors they signed
    audit_anchor_key_file: Path | None = None
    audit_anchor_public_keys: str = ""
    # Refusals (denied lookups, locked-out logins): identical ones within a window are one
    # counted row; each user and each address has this many distinct ones recorded per
    # window, and past that a denied lookup answers 429 (app/audit/refusals.py)
    audit_refusal_window_s: float = 60.0
    audit_refusals_per_window: int = 30
    log_level: str = "INFO"

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite under var_dir."""
        return self.database_url or f"sqlite:///{self.var_dir / 'nebula.db'}"

    @property
    def database_pool_size(self) -> int:
        """Connections per server process: no thread ever waits for one."""
        # + the credential checks, the readiness probe's own thread, the reaper and start-up
        return self.thread_pool_size + self.stream_threads + self.credential_check_threads + 3

    @property
    def resolved_data_dir(self) -> Path:
        """Where encrypted datasets and artifacts live."""
        return self.data_dir or self.var_dir / "data"

    def secret(self) -> bytes:
        """The platform secret; generated once into var_dir/secret_key when not configured."""
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        path = self.var_dir / "secret_key"
        if not path.exists():
            # 0600 from its first byte, complete before it has its name, and never replaced:
            # two processes starting at once both read the one that was linked first
            with contextlib.suppress(FileExistsError):
                create_private_file(path, secrets.token_urlsafe(48).encode())
        return path.read_text().strip().encode()


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()

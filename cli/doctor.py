"""`nebula doctor`: the control plane's health, each failing check with its fix.

It checks, from the control plane's host and with its settings: the database (reachable,
migrated to head), the broker, the platform secret against the CA key it encrypts, the
CA's expiry, the audit chain against its signed anchors, each cluster's broker user and
switch certificate, and (given --tls-cert) the API's own HTTPS certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from app.settings import Settings

OPERATIONS = "docs/operations.md"


@dataclass(frozen=True)
class Check:
    """One check's outcome: "ok", "warn" (acts soon) or "fail", and what to do about it."""

    name: str
    state: str
    detail: str
    fix: str = ""


def _ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def _expiry(name: str, not_after: datetime, warn: timedelta, fix: str) -> Check:
    now = datetime.now(UTC)
    not_after = not_after if not_after.tzinfo else not_after.replace(tzinfo=UTC)
    when = not_after.strftime("%Y-%m-%d %H:%M UTC")
    if not_after <= now:
        return Check(name, "fail", f"expired on {when}", fix)
    if not_after - now <= warn:
        return Check(name, "warn", f"expires on {when}", fix)
    return _ok(name, f"valid until {when}")


def renewal_command(cluster: str) -> str:
    """How an expired switch certificate is replaced (the switch can no longer renew it)."""
    return (
        f"on the control plane: nebula clusters bundle {cluster} --out {cluster}-bundle "
        "with the options its first bundle had (--control-plane-ca, --broker-ca: "
        "docs/deploy.md, step 4); "
        f"then on {cluster}'s switch host: move switch.crt and switch.key out of its bundle "
        "folder, install the new bundle there (owned by the service user) and restart "
        f"nebula-switch: it enrolls again ({OPERATIONS}, Certificates)"
    )


def run_checks(
    settings: Settings, *, tls_cert: Path | None = None, warn_days: int = 14
) -> list[Check]:
    """Every check, in the order an operator fixes them."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import select, text

    from app.audit import service as audit
    from app.audit.service import use_chain_key
    from app.clusters import broker
    from app.clusters.models import Certificate, Cluster
    from app.db import make_engine, make_sessionmaker
    from app.migrate import alembic_config
    from app.pki import service as pki
    from common.broker import broker_check

    warn = timedelta(days=warn_days)
    checks: list[Check] = []
    url = settings.resolved_database_url
    engine = use_chain_key(make_engine(url), settings)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            current = MigrationContext.configure(conn).get_current_revision()
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        if current != head:
            checks.append(
                Check(
                    "database",
                    "fail",
                    f"at migration {current}, the code wants {head}",
                    "as the role that owns the tables: nebula db upgrade; then re-apply the "
                    f"grants (nebula db grants ROLE | psql) ({OPERATIONS}, Upgrade)",
                )
            )
        else:
            checks.append(_ok("database", f"reachable, at migration {head}"))
    except Exception as exc:
        engine.dispose()
        checks.append(
            Check(
                "database",
                "fail",
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                "start PostgreSQL (systemctl start postgresql) and check NEBULA_DATABASE_URL "
                "in the env file, its password and pg_hba.conf",
            )
        )
        return checks  # nothing else can be read

    try:
        broker_check(settings.broker_url, settings.var_dir, timeout_s=5.0)
        checks.append(_ok("broker", settings.broker_url.split("://", 1)[0] or "embedded"))
    except Exception as exc:
        checks.append(
            Check(
                "broker",
                "fail",
                f"{type(exc).__name__}: {str(exc)[:200]}",
                "start the broker (systemctl start rabbitmq-server) and check "
                "NEBULA_BROKER_URL and its user's password",
            )
        )

    if checks[0].state != "ok":  # the tables are not what this code reads: upgrade first
        engine.dispose()
        return checks
    factory = make_sessionmaker(engine)
    with factory() as db:
        try:
            keys = pki.platform_keys(db, settings)
            checks.append(_ok("secret", "the platform secret opens the CA key"))
            checks.append(
                _expiry(
                    "CA",
                    keys.ca_cert.not_valid_after_utc,
                    timedelta(days=max(warn_days, 90)),
                    f"the platform CA must be replaced before it expires ({OPERATIONS}, "
                    "Certificates)",
                )
            )
        except Exception as exc:
            checks.append(
                Check(
                    "secret",
                    "fail",
                    f"the CA key does not open: {type(exc).__name__}: {str(exc)[:200]}",
                    "NEBULA_SECRET_KEY (or var/secret_key) must be the secret this database "
                    f"was made with: restore it from the backup ({OPERATIONS}, Backup)",
                )
            )
        try:
            result = audit.verify(db, settings=settings)
            if result.ok:
                checks.append(
                    _ok("anchors", f"{result.count} events, signed head at {result.anchored_seq}")
                )
            else:
                checks.append(
                    Check(
                        "anchors",
                        "fail",
                        f"audit chain broken at seq {result.first_bad_seq}: "
                        + "; ".join(p.detail for p in result.problems)[:300],
                        "restore data/audit/anchors.jsonl from the backup if it was lost; "
                        f"otherwise treat it as tampering ({OPERATIONS}, Backup; docs/audit.md)",
                    )
                )
        except Exception as exc:
            checks.append(
                Check(
                    "anchors",
                    "fail",
                    f"{type(exc).__name__}: {str(exc)[:200]}",
                    f"restore data/audit/anchors.jsonl from the backup ({OPERATIONS}, Backup)",
                )
            )
        for cluster in db.scalars(select(Cluster).order_by(Cluster.name)):
            if cluster.broker_user == "missing":
                checks.append(
                    Check(
                        f"cluster {cluster.name} broker user",
                        "fail",
                        cluster.broker_problem or "missing",
                        f"nebula clusters broker-user {cluster.name}",
                    )
                )
            newest = db.scalars(
                select(Certificate)
                .where(Certificate.cluster_id == cluster.id, Certificate.revoked_at.is_(None))
                .order_by(Certificate.not_after.desc())
                .limit(1)
            ).first()
            name = f"cluster {cluster.name} switch certificate"
            if newest is None:
                checks.append(_ok(name, "none yet (the switch has not enrolled)"))
            else:
                # a running switch renews at a third of its life left: one near its end has
                # not been renewing
                checks.append(_expiry(name, newest.not_after, warn, renewal_command(cluster.name)))
        if broker.is_rabbitmq(settings.broker_url) and broker.plain_off_loopback(
            settings.cluster_broker_url or settings.broker_url
        ):
            checks.append(
                Check(
                    "cluster broker URL",
                    "warn",
                    "clusters reach the broker without TLS (amqp://)",
                    "set NEBULA_CLUSTER_BROKER_URL=amqps://... and give bundles --broker-ca",
                )
            )
    engine.dispose()

    if tls_cert is not None:
        from cryptography import x509

        try:
            cert = x509.load_pem_x509_certificate(tls_cert.read_bytes())
            checks.append(
                _expiry(
                    "API certificate",
                    cert.not_valid_after_utc,
                    timedelta(days=max(warn_days, 30)),
                    f"replace {tls_cert} and its key, then systemctl restart nebula-api "
                    f"({OPERATIONS}, Certificates)",
                )
            )
        except (OSError, ValueError) as exc:
            checks.append(Check("API certificate", "fail", str(exc)[:200], f"check {tls_cert}"))
    return checks


def report(checks: list[Check], console: Console | None = None) -> int:
    """Print each check (red with its fix when failing); 1 if any failed."""
    console = console or Console()
    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    for check in checks:
        label = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[check.state]
        console.print(
            f"[{style[check.state]}]{label}[/] {check.name}: {check.detail}",
            highlight=False,
            soft_wrap=True,
        )
        if check.state != "ok" and check.fix:
            console.print(f"     fix: {check.fix}", highlight=False, soft_wrap=True)
    failed = [c for c in checks if c.state == "fail"]
    console.print(f"{len(checks) - len(failed)} of {len(checks)} checks pass", highlight=False)
    return 1 if failed else 0

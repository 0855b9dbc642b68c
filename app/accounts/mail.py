"""Outgoing mail (reset links) through the configured SMTP server, off the request path.

A message is handed to one background thread and the request answers at once: a request
for a known address must not take longer than one for an unknown address, and a slow or
unreachable mail server must not hold a request thread. A message that cannot be sent is
logged (never its link) and dropped; the user may ask again.
"""

from __future__ import annotations

import logging
import smtplib
import ssl
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import EmailMessage
from functools import lru_cache

from app.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mail:
    """One message to one recipient; the body may hold a secret, so it is never logged."""

    to: str
    subject: str
    body: str = field(repr=False)


@lru_cache(maxsize=1)
def _outbox() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="nebula-mail")


def _message(mail: Mail, settings: Settings) -> EmailMessage:
    message = EmailMessage()
    message["From"] = settings.smtp_from
    message["To"] = mail.to
    message["Subject"] = mail.subject
    message.set_content(mail.body)
    return message


def send_now(mail: Mail, settings: Settings) -> None:
    """Deliver `mail` to the SMTP server (blocking); raises on any failure."""
    context = ssl.create_default_context()
    smtp: smtplib.SMTP
    if settings.smtp_ssl:
        smtp = smtplib.SMTP_SSL(
            settings.smtp_host, settings.smtp_port, timeout=settings.smtp_timeout_s, context=context
        )
    else:
        smtp = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=settings.smtp_timeout_s)
    with smtp:
        if not settings.smtp_ssl and settings.smtp_starttls:
            # refused by smtplib when the server does not offer it: never fall back to clear text
            smtp.starttls(context=context)
        if settings.smtp_username:
            password = settings.smtp_password.get_secret_value() if settings.smtp_password else ""
            smtp.login(settings.smtp_username, password)
        smtp.send_message(_message(mail, settings))


def _deliver(mail: Mail, settings: Settings) -> None:
    try:
        send_now(mail, settings)
    except (OSError, smtplib.SMTPException) as exc:
        log.warning("mail to %s not sent: %s", mail.to, type(exc).__name__)


def send_later(mail: Mail, settings: Settings) -> Future[None] | None:
    """Queue `mail` for the mail thread; None (logged) when no SMTP server is configured."""
    if not settings.smtp_host:
        log.warning("mail to %s not sent: NEBULA_SMTP_HOST is not set", mail.to)
        return None
    return _outbox().submit(_deliver, mail, settings)

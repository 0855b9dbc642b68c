"""Password hashing (argon2id through passlib's API, from libpass) and the password policy."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import TypeVar

from passlib.hash import argon2

from app.errors import Invalid, TooManyAttempts
from app.settings import Settings

T = TypeVar("T")
# Hashing threads yield the CPU to request threads: a login flood slows logins, not the API.
HASH_THREAD_NICE = 19

# stored for accounts without a password: no argon2 hash has this form, so nothing verifies
UNUSABLE_HASH = "!no-password"
MIN_LENGTH = 12
MAX_LENGTH = 256
# A short list of the passwords that top every breach corpus, at our minimum length or above.
COMMON_PASSWORDS = frozenset(
    {
        "password1234",
        "password12345",
        "password123456",
        "passwordpassword",
        "123456789012",
        "1234567890123",
        "12345678901234",
        "qwertyuiopas",
        "qwerty123456",
        "qwertyqwerty",
        "iloveyou1234",
        "letmein12345",
        "welcome12345",
        "admin1234567",
        "administrator",
        "changeme1234",
        "abc123456789",
        "aaaaaaaaaaaa",
        "111111111111",
        "000000000000",
        "trustno1trustno1",
        "football1234",
        "baseball1234",
        "sunshine1234",
        "princess1234",
        "monkey123456",
        "dragon123456",
        "nebula123456",
        "correcthorsebatterystaple",
    }
)


@lru_cache(maxsize=8)
def _hasher(time_cost: int, memory_kib: int, parallelism: int) -> type[argon2]:
    return argon2.using(
        type="ID", rounds=time_cost, memory_cost=memory_kib, parallelism=parallelism
    )


def _lower_priority() -> None:
    # Linux sets nice per thread, and argon2's lane threads inherit it from this one.
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_THREAD_NICE)


class PasswordGate:
    """Argon2 runs one at a time on a low-priority thread; a few more may wait, the rest 429."""

    def __init__(self, slots: int) -> None:
        self._admitted = threading.BoundedSemaphore(max(1, slots))
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="nebula-argon2", initializer=_lower_priority
        )

    def run(self, work: Callable[[], T]) -> T:
        """`work()` on the hashing thread, or TooManyAttempts when the waiting room is full."""
        if not self._admitted.acquire(blocking=False):
            raise TooManyAttempts("too many password checks at once; try again in a moment")
        try:
            return self._executor.submit(work).result()
        finally:
            self._admitted.release()


@lru_cache(maxsize=4)
def _gate(slots: int) -> PasswordGate:
    return PasswordGate(slots)


def hash_password(password: str, settings: Settings) -> str:
    """An argon2id hash of `password` (slow on purpose: never inside a transaction)."""
    hasher = _hasher(
        settings.argon2_time_cost, settings.argon2_memory_kib, settings.argon2_parallelism
    )
    return _gate(settings.password_hash_slots).run(lambda: str(hasher.hash(password)))


def _verify(password: str, password_hash: str) -> bool:
    try:
        return bool(argon2.verify(password, password_hash))
    except ValueError:
        return False


def verify_password(password: str, password_hash: str, settings: Settings) -> bool:
    """Whether `password` matches; parameters come from the hash itself."""
    return _gate(settings.password_hash_slots).run(lambda: _verify(password, password_hash))


@lru_cache(maxsize=8)
def _dummy_hash(time_cost: int, memory_kib: int, parallelism: int) -> str:
    return str(_hasher(time_cost, memory_kib, parallelism).hash("not a password"))


def burn_verify(password: str, settings: Settings) -> None:
    """Spend a verification on nothing (unknown user) so timing does not reveal existence."""
    params = (settings.argon2_time_cost, settings.argon2_memory_kib, settings.argon2_parallelism)
    # the dummy hash is made on the hashing thread too: a flood's first requests must not
    # each compute it at once on request threads
    _gate(settings.password_hash_slots).run(lambda: _verify(password, _dummy_hash(*params)))


def check_policy(password: str, *, email: str) -> None:
    """Raise Invalid unless the password is long, not the email and not a common one."""
    if len(password) < MIN_LENGTH:
        raise Invalid(f"password must have at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise Invalid(f"password must have at most {MAX_LENGTH} characters")
    lowered = password.lower()
    local_part = email.lower().split("@", 1)[0]
    if lowered == email.lower() or (len(local_part) >= 4 and local_part in lowered):
        raise Invalid("password must not contain the email address")
    if lowered in COMMON_PASSWORDS or len(set(password)) < 4:
        raise Invalid("password is too common")

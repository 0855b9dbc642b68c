"""Password hashing (argon2id through passlib's API, from libpass) and the password policy."""

from __future__ import annotations

from functools import lru_cache

from passlib.hash import argon2

from app.errors import Invalid
from app.settings import Settings

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


def hash_password(password: str, settings: Settings) -> str:
    """An argon2id hash of `password` (slow on purpose: call it off the event loop)."""
    hasher = _hasher(
        settings.argon2_time_cost, settings.argon2_memory_kib, settings.argon2_parallelism
    )
    return str(hasher.hash(password))


def verify_password(password: str, password_hash: str) -> bool:
    """Whether `password` matches; parameters come from the hash itself."""
    try:
        return bool(argon2.verify(password, password_hash))
    except ValueError:
        return False


@lru_cache(maxsize=8)
def _dummy_hash(time_cost: int, memory_kib: int, parallelism: int) -> str:
    return str(_hasher(time_cost, memory_kib, parallelism).hash("not a password"))


def burn_verify(password: str, settings: Settings) -> None:
    """Spend a verification on nothing (unknown user) so timing does not reveal existence."""
    verify_password(
        password,
        _dummy_hash(
            settings.argon2_time_cost, settings.argon2_memory_kib, settings.argon2_parallelism
        ),
    )


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

"""The switch fixtures, from tests/switch_support.py."""

from switch_support import (  # noqa: F401  (fixtures are found by name)
    Pki,
    configure,
    cutting_proxy,
    make_pair,
    other_pki,
    pair,
    pki,
    switch_log,
)

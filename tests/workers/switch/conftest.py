"""The switch fixtures, from tests/support/switches.py."""

from support.switches import (  # noqa: F401  (fixtures are found by name)
    configure,
    cutting_proxy,
    make_pair,
    other_pki,
    pair,
    pki,
    switch_log,
)

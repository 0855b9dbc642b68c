"""The security suite uses the switch fixtures too."""

from support.switches import (  # noqa: F401  (fixtures are found by name)
    configure,
    make_pair,
    pair,
    pki,
    switch_log,
)

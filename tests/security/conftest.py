"""The security suite uses the switch fixtures too."""

from switch_support import (  # noqa: F401  (fixtures are found by name)
    configure,
    make_pair,
    pair,
    pki,
    switch_log,
)

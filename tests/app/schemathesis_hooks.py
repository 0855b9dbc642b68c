"""Schemathesis hooks for the OpenAPI run (tests/app/test_openapi_fuzz.py), loaded by its CLI.

Two string formats of the document carry rules JSON Schema cannot write down; these strategies
generate values that keep them, so that a refusal of such a value is a real finding.
"""

from __future__ import annotations

import string

import schemathesis
from hypothesis import strategies as st

from app.accounts.passwords import COMMON_PASSWORDS, MAX_LENGTH, MIN_LENGTH
from workers.compression import parse_spec

# `format: codec-spec`: the grammar of workers.compression.spec, which is recursive.
BASE_CODECS = ["none", "fp16", "bf16", "int8", "int8(stochastic=true)"]
LOWRANK = st.builds(
    "lowrank({},method={})".format,
    st.sampled_from(["0.1", "0.25", "0.5"]),
    st.sampled_from(["svd", "rsvd", "power"]),
)
CODEC_SPECS = st.one_of(
    st.sampled_from(BASE_CODECS),
    LOWRANK,
    st.builds("{}({})".format, st.sampled_from(["fp16", "bf16", "int8"]), LOWRANK),
    # ABNet's streams are per sample, where ef(...) is refused; `auto` is a spec there too
    st.just("auto"),
).filter(lambda spec: spec == "auto" or parse_spec(spec) is not None)

# `format: password`: the policy beyond its lengths (app.accounts.passwords.check_policy) wants
# four distinct characters and no common password; the email rule is left to chance, and the
# local parts the fuzzer draws are too short to matter.
PASSWORDS = st.text(
    alphabet=string.ascii_letters + string.digits + "-_.",
    min_size=MIN_LENGTH,
    max_size=min(MAX_LENGTH, 40),
).filter(lambda p: len(set(p)) >= 4 and p.lower() not in COMMON_PASSWORDS)

schemathesis.openapi.format("codec-spec", CODEC_SPECS)
schemathesis.openapi.format("password", PASSWORDS)

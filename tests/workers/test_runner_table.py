"""The runner is driven by the kinds table: one training entry per (kind, role) it names."""

from __future__ import annotations

from contract.kinds import KINDS
from workers.runner import ROLE_ENTRIES


def test_every_role_of_the_table_has_its_training_code_and_no_other() -> None:
    assert set(ROLE_ENTRIES) == {
        (kind, role) for kind, spec in KINDS.items() for role in spec.roles
    }


def test_each_role_reads_one_model_at_most() -> None:
    # RoleInputs.model() hands a role its only model input
    for spec in KINDS.values():
        kinds = {**spec.inputs, **spec.optional_inputs}
        for role in spec.roles.values():
            assert sum(kinds[name] == "model" for name in role.reads) <= 1

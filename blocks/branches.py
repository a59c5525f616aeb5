"""Where fixes go as branches, as a Prefect block: the push URL, branch prefix and author (declared once:
bugsweep.branches.BranchFields), and the token as a Prefect Secret block."""

from __future__ import annotations

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from pydantic import ConfigDict, Field, SecretStr

from blocks.schema import reference_is_not_a_block
from bugsweep.branches import BranchFields


class GitBranches(Block, BranchFields):
    """Resolved fixes pushed as branches PREFIX/SWEEP/TASK to a git repository.

    The token lives in a Prefect Secret block of its own (stored encrypted, never shown): this block holds a
    reference to it, and the flows read it only to hand it to bugsweep.branches, which sends it to the git server
    as a header and nowhere else.
    """

    model_config = ConfigDict(json_schema_extra=reference_is_not_a_block("prefix"))

    _block_type_name = "bugsweep git branches"
    _description = (
        "Where bugsweep pushes resolved fixes as branches (push URL, prefix, author) and its token."
    )

    token: Secret[str] | None = Field(
        default=None,
        description="A Secret block holding the token for pushing over HTTP(S); empty: git's own credentials "
        "(an SSH key, a credential helper) or none.",
    )

    def settings(self) -> BranchFields:
        return BranchFields(**self.model_dump(include=set(BranchFields.model_fields)))

    def token_value(self) -> SecretStr | None:
        """The token, read from its Secret block; None without one."""
        if self.token is None:
            return None
        return SecretStr(str(self.token.get()))

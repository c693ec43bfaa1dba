"""What every recognized block answers besides its shape: its plan entries, whether it can be
entered where its layer calls it, and what stays whole beside it.

Each family's block (a frozen dataclass: ``ShardedBlock``, ``MoeBlock``, ``Mamba2Block``, ...)
derives from :class:`FamilyBlock` and overrides what differs, so the synthesizer asks the block
instead of testing its type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plan import PlanEntry, Replicated
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart

# Why a block is kept whole when the layer's call of it could not be read.
UNREAD_CALL = "whose call by the layer the reader cannot follow"


class Unplaced(NamedTuple):
    """Why a recognized block stays whole where its layer calls it as it does."""

    why: str
    group: str
    # The call was read (only not as the block's style needs it): under sequence parallel the block
    # is handed the whole sequence, as a block no family shards is.
    gathered: bool = False


class FamilyBlock:
    """The questions the synthesizer asks a recognized block; the defaults suit a block whose style
    takes the hidden state however the layer passes it."""

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        """Why the block cannot be sharded where its layer calls it (``call``; None: unread)."""
        return None

    def kept_beside(self, path: str) -> list[Replicated]:
        """Modules of the block at ``path`` that its plan keeps whole (routers, latent down-projections)."""
        return []

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        """This block's plan entries at ``part.path`` (its layer's call in ``part.call``), SP or not."""
        raise NotImplementedError(type(self).__name__)

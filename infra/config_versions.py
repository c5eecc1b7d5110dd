"""Stack keys for the served version: a pin (``servedVersion``: roll back to a
version, or stay on one, until it is unset) and the retention of published versions
(``keepVersions``), both passed to the cube transfer (``--pin-version``,
``--keep-versions``; ``runtime.cube.transfer.rollback`` and ``retention``).

``VersionKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like any
other: ``Pulumi.yaml`` declares them, ``infra.config_load.parse`` validates them). A change of
``servedVersion`` shows in the preview as an update of the transfer's Deployment (its
arguments).
"""
from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check

VersionId = Annotated[str, _check(lambda v: v == "" or (v.isdigit() and len(v) <= 19),
                                  "empty (follow training) or a version id (digits)")]
Keep = Annotated[int, _check(lambda v: 0 <= v <= 100000, "an integer in [0, 100000]")]


class VersionKeys(BaseModel):
    """The served-version keys of the stack (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    served_version: VersionId = Field(
        "", description="Version id to serve instead of following training (a rollback or a pin: its chain is "
                        "laid out on every cube shard x replica, serving switches to it); empty: follow training.")
    keep_versions: Keep = Field(
        0, description="Published versions kept under the version root; older ones are deleted from the file "
                       "server or object store, never the served chain nor a pinned one (0 = keep all).")

    def pin_version(self) -> Optional[int]:
        """``servedVersion`` as the transfer's ``--pin-version`` (None: follow training)."""
        return int(self.served_version) if self.served_version else None

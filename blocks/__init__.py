"""Prefect blocks: configuration plus a factory for what it configures. Secrets live only here (or in settings).

- `ModelEndpoint` -> `.settings()` (ModelSettings for the agent);
- `LocalSandbox`, `RuntimeSandbox` -> `.provider()` (a bugsweep SandboxProvider);
- prefect-aws's `S3Bucket` (with its `AwsCredentials`) -> `bucket_store(block)` (a bugsweep.storage S3 store);
- `GitBranches` -> `.settings()` and `.token_value()` (where resolved fixes are pushed as branches; the token in a
  Prefect Secret block).

`bugsweep blocks create` saves one of each from the environment under the names below, which the flows use when no
block is chosen.
"""

from __future__ import annotations

from blocks.branches import GitBranches
from blocks.model import ModelEndpoint
from blocks.sandbox import LocalSandbox, RuntimeSandbox
from blocks.storage import bucket_store

MODEL_BLOCK = "bugsweep-model"
LOCAL_SANDBOX_BLOCK = "bugsweep-local"
RUNTIME_SANDBOX_BLOCK = "bugsweep-runtime"
STORE_BLOCK = "bugsweep-artifacts"
BRANCHES_BLOCK = "bugsweep-branches"

__all__ = [
    "BRANCHES_BLOCK",
    "LOCAL_SANDBOX_BLOCK",
    "MODEL_BLOCK",
    "RUNTIME_SANDBOX_BLOCK",
    "STORE_BLOCK",
    "GitBranches",
    "LocalSandbox",
    "ModelEndpoint",
    "RuntimeSandbox",
    "bucket_store",
]

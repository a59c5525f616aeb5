"""The artifact store as a Prefect block: an S3-compatible bucket and prefix, or a local folder (the default)."""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from bugsweep.storage import ArtifactStore, LocalStore, S3Store


class ArtifactStoreBlock(Block):
    """Where run folders go: `s3://BUCKET/PREFIX/SWEEP/TASK/MODEL/` when a bucket is set, else the local folder.

    Run folders are always written to `local_dir` first and uploaded from there, so an S3 outage loses nothing.
    The credentials are stored encrypted; empty credentials use boto3's default chain (instance role, ~/.aws).
    """

    _block_type_name = "bugsweep artifact store"
    _description = (
        "Where bugsweep keeps patches, trajectories, grades and test logs: an S3 bucket or a folder."
    )

    bucket: str | None = Field(
        default=None, description="S3 bucket; empty: keep everything in the local folder."
    )
    prefix: str = Field(default="bugsweep", description="Key prefix inside the bucket.")
    endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for non-AWS servers (SeaweedFS, MinIO, R2...); empty: AWS."
    )
    region: str | None = Field(default=None, description="S3 region; empty: boto3's default.")
    access_key_id: SecretStr | None = Field(default=None, description="S3 access key id.")
    secret_access_key: SecretStr | None = Field(default=None, description="S3 secret access key.")
    attempts: int = Field(
        default=4, description="Tries per S3 call before the upload step gives up (and retries)."
    )
    local_dir: str = Field(
        default="./artifacts",
        description="Folder for run folders on the worker (and the store when no bucket).",
    )

    def store(self) -> ArtifactStore:
        """The bugsweep.storage store this block describes."""
        if not self.bucket:
            return LocalStore(self.local_dir)
        return S3Store(
            bucket=self.bucket,
            prefix=self.prefix,
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            attempts=self.attempts,
        )

    def local_root(self) -> Path:
        """Where run folders are written before they are uploaded."""
        return Path(self.local_dir).expanduser().resolve()

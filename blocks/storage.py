"""The artifact store as Prefect blocks: prefect-aws's `S3Bucket` (bucket, folder) and its `AwsCredentials`.

Teams already have these blocks in their workspaces, and the UI has forms for them. bugsweep reads the bucket, the
folder and the credentials from the block, and does the uploading itself (bugsweep.storage: whole-call retries,
grade.json last, the pending marker), through a boto3 client made from the block's own session and client
parameters. Run folders are always written to the worker's local folder first (BUGSWEEP_STORE_LOCAL_DIR) and
uploaded from there, so an S3 outage loses nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bugsweep.storage import S3Store, StoreSettings, s3_client

if TYPE_CHECKING:
    from prefect_aws import S3Bucket


def bucket_store(bucket: S3Bucket, settings: StoreSettings | None = None) -> S3Store:
    """The bugsweep store for an `S3Bucket` block: its bucket, its `bucket_folder` as the key prefix, a client from
    its credentials (AwsCredentials or MinIOCredentials, with their endpoint, region and botocore config)."""
    settings = settings or StoreSettings()
    credentials = bucket.credentials
    params = credentials.aws_client_parameters.get_params_override()
    client = s3_client(credentials.get_boto3_session(), **params)
    return S3Store(
        bucket=bucket.bucket_name, prefix=bucket.bucket_folder, client=client, attempts=settings.attempts,
        link_days=settings.link_days,
    )  # fmt: skip

"""`bugsweep blocks create`: the model endpoint, sandbox and S3 bucket blocks, made from the environment, checked
before they are saved, and never replacing a block that exists unless asked.

Checked means: the model endpoint is asked which models it serves (a wrong URL, key or model name is one line
and exit 2), and the S3 endpoint whether the bucket exists (it is made with `--create-bucket`, or after a yes at a
terminal). Nothing is saved until every check passed, so a failed command leaves the existing blocks as they were.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bugsweep.cli.options import print_table

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

blocks_app = typer.Typer(
    rich_markup_mode=None,
    help="Prefect blocks: the model endpoint, sandboxes and artifact store.",
    no_args_is_help=True,
)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


@dataclass
class _Planned:
    block: Any
    name: str
    what: str

    @property
    def slug(self) -> str:
        return f"{self.block.get_block_type_slug()}/{self.name}"


@blocks_app.command("create")
def blocks_create(
    overwrite: Annotated[
        bool,
        typer.Option(help="Replace blocks that already exist (without it, an existing block is an error)."),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            help="Check the model endpoint and the S3 bucket before saving (--no-check: save as given)."
        ),
    ] = True,
    create_bucket: Annotated[
        bool, typer.Option(help="Make the S3 bucket when it does not exist (at a terminal you are asked).")
    ] = False,
) -> None:
    """Save the model endpoint, sandbox and S3 bucket (prefect-aws S3Bucket + AwsCredentials) blocks from the
    environment, after checking that the model endpoint serves the model and that the S3 bucket exists.

    Reads LLM_BASE_URL / LLM_MODEL / LLM_API_KEY (and LLM_PRICE_*), BUGSWEEP_SANDBOX_*, RUNTIME_API_KEY, and
    BUGSWEEP_STORE_URL (s3://BUCKET/PREFIX or a folder; BUGSWEEP_STORE_LOCAL_DIR for local copies) with
    AWS_ENDPOINT_URL / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Secrets are stored encrypted in the blocks and
    never printed. Exit code 2, with nothing saved, when a check fails or a block exists (without --overwrite).
    """
    from bugsweep.cli.pipeline import _hint_server
    from bugsweep.errors import BugsweepError

    _hint_server()
    try:
        planned, checks = _plan()
    except BugsweepError as exc:
        _fail(str(exc))
    if not overwrite:
        existing = [p.slug for p in planned if _exists(p)]
        if existing:
            _fail(
                f"these blocks exist already: {', '.join(existing)}. Nothing was saved; pass --overwrite to "
                "replace them"
            )
    if check:
        for run_check in checks:
            try:
                run_check(create_bucket)
            except BugsweepError as exc:
                _fail(f"{exc}. Nothing was saved (--no-check saves without checking)")
    saved = Table(title="blocks")
    for column in ("block", "name", "what"):
        saved.add_column(column, overflow="fold")
    for p in planned:
        p.block.save(p.name, overwrite=overwrite)
        saved.add_row(p.block.get_block_type_name(), p.name, p.what)
    print_table(console, saved)


def _exists(planned: _Planned) -> bool:
    try:
        type(planned.block).load(planned.name)
    except ValueError:  # Prefect's "Unable to find block document named ..."
        return False
    return True


def _plan() -> tuple[list[_Planned], list[Any]]:
    """The blocks to save, and the checks to run before saving them."""
    import blocks
    from blocks import LocalSandbox, ModelEndpoint, RuntimeSandbox
    from bugsweep.runconfig import SandboxLimits
    from bugsweep.sandbox.runtime import RuntimeSettings
    from bugsweep.settings import ModelSettings, SandboxSettings
    from bugsweep.storage import StoreSettings, split_s3_uri

    planned: list[_Planned] = []
    checks: list[Any] = []
    model = ModelSettings()
    if model.base_url:
        key = "API key set" if model.api_key.get_secret_value() else "no API key"
        planned.append(
            _Planned(
                ModelEndpoint.from_settings(model),
                blocks.MODEL_BLOCK,
                f"{model.model} at {model.base_url} ({key})",
            )
        )
        checks.append(lambda _create: _check_model(model))
    else:
        console.print(
            "[dim]LLM_BASE_URL is not set: no model endpoint block (flows use the embedded model)[/]"
        )

    sandbox = SandboxSettings()
    local = LocalSandbox(**sandbox.model_dump(include=set(SandboxLimits.model_fields)))
    planned.append(
        _Planned(
            local, blocks.LOCAL_SANDBOX_BLOCK, f"{sandbox.memory_mib} MiB, {sandbox.max_processes} processes"
        )
    )

    runtime = RuntimeSettings()  # type: ignore[call-arg]
    if runtime.api_key.get_secret_value():
        runtime_block = RuntimeSandbox.from_settings(runtime, setup_network=sandbox.setup_network)
        memory = runtime.memory_mib or sandbox.memory_mib
        planned.append(
            _Planned(
                runtime_block,
                blocks.RUNTIME_SANDBOX_BLOCK,
                f"{runtime.vcpu} vCPU, {memory} MiB (API key set)",
            )
        )

    store = StoreSettings()
    if store.url.startswith("s3://"):
        from prefect_aws import AwsCredentials, S3Bucket
        from prefect_aws.client_parameters import AwsClientParameters

        bucket, prefix = split_s3_uri(store.url)
        credentials = AwsCredentials(
            aws_access_key_id=store.access_key_id.get_secret_value() if store.access_key_id else None,
            aws_secret_access_key=store.secret_access_key, region_name=store.region,
            aws_client_parameters=AwsClientParameters(endpoint_url=store.endpoint_url),
        )  # fmt: skip
        keys = "keys set" if store.secret_access_key else "boto3's default credentials"
        bucket_block = S3Bucket(bucket_name=bucket, bucket_folder=prefix, credentials=credentials)
        planned.append(_Planned(credentials, blocks.STORE_BLOCK, f"{store.endpoint_url or 'AWS'} ({keys})"))
        planned.append(
            _Planned(
                bucket_block, blocks.STORE_BLOCK, f"{store.url} with the {blocks.STORE_BLOCK} credentials"
            )
        )
        checks.append(lambda create: _check_bucket(bucket_block, create))
    else:
        folder = str(Path(store.url).expanduser().resolve())
        console.print(
            f"[dim]BUGSWEEP_STORE_URL is a folder ({folder}): no S3 bucket block; flows keep run folders in "
            "BUGSWEEP_STORE_URL on each worker[/]",
            soft_wrap=True,
        )
    return planned, checks


def _check_model(model: Any) -> None:
    from bugsweep.agent.model import ChatModel

    served = ChatModel(model).check()
    listed = f" (it serves {', '.join(served[:5])})" if served else ""
    console.print(f"model endpoint {model.base_url}: answers for {model.model}{listed}", soft_wrap=True)


def _check_bucket(bucket_block: Any, create: bool) -> None:
    from blocks import bucket_store
    from bugsweep.errors import StorageError

    store = bucket_store(bucket_block)
    where = store.client.meta.endpoint_url
    if store.check_bucket():
        console.print(f"S3 bucket {store.bucket} at {where}: exists", soft_wrap=True)
        return
    if not create and sys.stdin.isatty():
        create = typer.confirm(
            f"The S3 bucket {store.bucket!r} does not exist at {where}. Make it?", default=True
        )
    if not create:
        raise StorageError(
            f"the S3 bucket {store.bucket!r} does not exist at {where}: make it (pass --create-bucket, or "
            "`aws s3 mb`) or fix BUGSWEEP_STORE_URL"
        )
    store.ensure_bucket()
    console.print(f"S3 bucket {store.bucket} at {where}: made", soft_wrap=True)

"""The artifact store: where run folders (patch.diff, trajectory.json, grade.json, test logs) are kept for good.

Two backends behind one small interface, `ArtifactStore`:
- `LocalStore`: a folder on this machine (the embedded default: nothing to set up);
- `S3Store`: a bucket and prefix on any S3-compatible server (AWS, SeaweedFS, ...) through a boto3 client, made
  from a prefect-aws `S3Bucket` block's credentials (blocks/storage.py) or from the BUGSWEEP_STORE_* settings.

Runs are filed under `PREFIX/SWEEP/TASK/MODEL/CONFIG/` (see `run_key`; CONFIG is the digest of the run's
configuration), so a sweep can tell which tasks a model has already been graded on under this configuration, and
a person can browse one bug's attempts side by side. This module is plain code with no
Prefect in it; the Prefect layer (tasks/, blocks/) only calls it.

An S3 fault has one retry layer, the store's: tenacity around each call (`S3Store.attempts` tries, waits doubling
from 0.5 s up to 16 s: an outage of about 45 s is ridden out). botocore's own retries are off and the Prefect upload
step does not retry, so one failing call is `attempts` requests, never attempts x botocore's x the step's. What
still fails becomes a `StorageError` that says how many tries it took, and the local run folder is never touched
by an upload, so nothing is lost when the store is down (bugsweep.upload: the flows keep it with an
`upload-pending.json` marker).
"""

from __future__ import annotations

import mimetypes
import os
import re
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from bugsweep.errors import ConfigError, StorageError

T = TypeVar("T")

#: Name of the file whose presence means "this task was graded for this model"; uploaded last.
GRADE_FILE = "grade.json"
#: The longest a presigned link can open: SigV4 signatures (what S3 and every S3-compatible server take) last at most
#: 7 days.
MAX_LINK_DAYS = 7.0


class StoreSettings(BaseSettings):
    """Where artifacts go. Read from BUGSWEEP_STORE_* (and the usual AWS_* names for the S3 credentials)."""

    model_config = SettingsConfigDict(
        env_prefix="BUGSWEEP_STORE_", env_file=".env", extra="ignore", populate_by_name=True
    )

    url: str = "./artifacts"
    """A local folder, or `s3://BUCKET/PREFIX` for an S3-compatible bucket."""
    local_dir: str = "./artifacts"
    """Where run folders are written before they are uploaded (and stay, should the upload fail)."""
    endpoint_url: str | None = Field(
        default=None, validation_alias=AliasChoices("BUGSWEEP_STORE_ENDPOINT_URL", "AWS_ENDPOINT_URL")
    )
    """S3 endpoint for non-AWS servers (e.g. http://127.0.0.1:8333 for SeaweedFS); unset: AWS."""
    region: str | None = Field(
        default=None, validation_alias=AliasChoices("BUGSWEEP_STORE_REGION", "AWS_DEFAULT_REGION")
    )
    """S3 region; unset: boto3's default chain."""
    access_key_id: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("BUGSWEEP_STORE_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID")
    )
    """S3 access key id; unset: boto3's default credential chain (instance role, ~/.aws, ...)."""
    secret_access_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("BUGSWEEP_STORE_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    )
    """S3 secret key. Never logged."""
    attempts: int = 8
    """Tries per S3 call: the one retry layer of an S3 fault (botocore's own retries are off)."""
    link_days: float = Field(default=MAX_LINK_DAYS, gt=0, le=MAX_LINK_DAYS)
    """How long the links put into Prefect artifacts open (presigned GET links to a private bucket), in days: at
    most 7, the longest a SigV4 signature allows (and no longer than the credentials that sign them live)."""


@dataclass(frozen=True)
class Link:
    """An address a person can open in a browser, and until when it opens (None: for good)."""

    url: str
    expires: datetime | None = None

    def until(self) -> str:
        """'opens until 2026-12-11 09:00 UTC' (or 'opens for good'), for the text beside the link."""
        if self.expires is None:
            return "opens for good"
        return f"opens until {self.expires.strftime('%Y-%m-%d %H:%M')} UTC"


@runtime_checkable
class ArtifactStore(Protocol):
    """Keys are '/'-separated paths relative to the store's root (its folder, or its bucket prefix)."""

    location: str
    """Where the store's root is, for messages: a folder path or s3://bucket/prefix."""

    def put_bytes(self, key: str, data: bytes) -> str:
        """Store `data` under `key`; returns the object's URI."""
        ...

    def put_file(self, key: str, path: Path) -> str:
        """Store a local file under `key`; returns the object's URI."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The object's content. Raises FileNotFoundError when there is none."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, folder: str = "") -> list[str]:
        """Every key in `folder` ('' the whole store), sorted. A folder ends at a '/': folder `nightly` never
        holds the keys of `nightly-fail`."""
        ...

    def uri(self, key: str) -> str:
        """A stable name of the object (file path or s3://bucket/key)."""
        ...

    def link(self, key: str) -> Link | None:
        """A link a person who can see the Prefect UI opens in a browser (a presigned GET of a private bucket,
        with its expiry); None when the store has none (a folder on one machine: give the content itself)."""
        ...


# -- keys -------------------------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+@-]+")


def key_part(name: str) -> str:
    """One key segment from a free-form name: model names such as 'Qwen/Qwen2.5-Coder' hold slashes and colons."""
    part = _UNSAFE.sub("_", name).strip("._")
    if not part:
        raise ConfigError(f"cannot make a storage key from {name!r}")
    return part


def run_key(sweep: str, task: str, model: str, config: str, run: int | None = None) -> str:
    """`SWEEP/TASK/MODEL/CONFIG` (or `.../CONFIG/run-N` when one task is run several times, as a comparison does).

    CONFIG is the digest of the run's configuration (bugsweep.runconfig.RunConfig.digest): one model's results
    under two configurations (another policy, turn budget, temperature, sandbox limit, ...) are kept side by side.
    MODEL is the model's name (a comparison's entry name)."""
    parts = [key_part(sweep), key_part(task), key_part(model), key_part(config)]
    if run is not None:
        parts.append(f"run-{run}")
    return "/".join(parts)


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


# -- local folder -------------------------------------------------------------------------------------------------


class LocalStore:
    """A folder. Writes are atomic (temporary file, then rename), so a reader never sees half a grade.json."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise ConfigError(f"storage key {key!r} leaves the store folder {self.root}")
        return path

    def put_bytes(self, key: str, data: bytes) -> str:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as exc:
            raise StorageError(f"could not write {path}: {exc}") from exc
        return str(path)

    def put_file(self, key: str, path: Path) -> str:
        target = self._path(key)
        if Path(path).resolve() == target:
            return str(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            shutil.copyfile(path, tmp)
            tmp.replace(target)
        except OSError as exc:
            raise StorageError(f"could not copy {path} to {target}: {exc}") from exc
        return str(target)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no {key} in {self.location}")
        return path.read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, folder: str = "") -> list[str]:
        base = self._path(folder) if folder else self.root
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.endswith(".tmp")
        )

    def uri(self, key: str) -> str:
        return str(self._path(key))

    def link(self, key: str) -> Link | None:
        """None: a file:// address opens only on this machine, never from the Prefect UI elsewhere."""
        return None

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"


# -- S3 -----------------------------------------------------------------------------------------------------------


def _is_transient(exc: BaseException) -> bool:
    """Worth another try: connection trouble, timeouts, throttling and 5xx. Not: access denied, no such bucket."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = exc.response.get("Error", {}).get("Code", "")
        return status >= 500 or status == 429 or code in {"SlowDown", "RequestTimeout", "Throttling"}
    return isinstance(exc, BotoCoreError | ConnectionError | TimeoutError)


def _is_missing(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code = exc.response.get("Error", {}).get("Code", "")
    return code in {"404", "NoSuchKey", "NotFound"}


#: How bugsweep's S3 clients wait unless the client parameters say otherwise: a short connect timeout, so an S3
#: server that is down is noticed in seconds and left to the store's own tries.
CLIENT_CONFIG: dict[str, Any] = {"connect_timeout": 5.0, "read_timeout": 60.0}
#: botocore sends each request once, whatever the client parameters or AWS_MAX_ATTEMPTS say: the store's tries
#: (`S3Store.attempts`) are the one retry layer of an S3 fault. (`total_max_attempts` counts the first request;
#: botocore's `max_attempts` counts only retries, so `max_attempts: 1` would still send two.)
NO_BOTOCORE_RETRIES: dict[str, Any] = {"total_max_attempts": 1, "mode": "standard"}


def s3_client(session: Any = None, **params: Any) -> Any:
    """A boto3 S3 client from `session` (a boto3.Session holding the credentials; None: boto3's default chain).

    `params` are boto3's client arguments (`endpoint_url`, `region_name`, `config`, `verify`, ...), as a prefect-aws
    block's `aws_client_parameters.get_params_override()` gives them. `CLIENT_CONFIG` fills in what their `config`
    leaves unset, except retries: botocore's are always off (`NO_BOTOCORE_RETRIES`). Requests, presigned links
    included, are signed with SigV4 unless `config` says otherwise (botocore presigns with SigV2 by default, which
    AWS refuses in most regions). An `endpoint_url` (a non-AWS server such as SeaweedFS) gets path-style addressing
    and, with no region anywhere, us-east-1.
    """
    import boto3
    from botocore.config import Config

    session = session or boto3.Session()
    params = {k: v for k, v in params.items() if v is not None}
    defaults: dict[str, Any] = {**CLIENT_CONFIG, "signature_version": "s3v4"}  # presigned links: SigV4 too
    if params.get("endpoint_url"):
        defaults["s3"] = {
            "addressing_style": "path"
        }  # works with every S3-compatible server; AWS accepts it too
        if not params.get("region_name") and not session.region_name:
            params["region_name"] = "us-east-1"
    config = Config(**defaults)
    if params.get("config") is not None:
        config = config.merge(params["config"])
    params["config"] = config.merge(Config(retries=dict(NO_BOTOCORE_RETRIES)))
    return session.client("s3", **params)


def settings_s3_client(settings: StoreSettings) -> Any:
    """The S3 client `settings` describe (BUGSWEEP_STORE_* / AWS_* variables), for use without Prefect blocks."""
    import boto3

    session = boto3.Session(
        aws_access_key_id=settings.access_key_id.get_secret_value() if settings.access_key_id else None,
        aws_secret_access_key=settings.secret_access_key.get_secret_value()
        if settings.secret_access_key
        else None,
        region_name=settings.region,
    )
    return s3_client(session, endpoint_url=settings.endpoint_url)


#: Longest wait between two tries of an S3 call.
MAX_RETRY_WAIT_S = 16.0


@dataclass
class S3Store:
    """A bucket and key prefix on an S3-compatible server, through a boto3 S3 client (see `s3_client`).

    The client decides where and as whom (credentials, endpoint, region); the store adds the keys, the retries
    (the only ones: `s3_client` turns botocore's off), and errors that name the object and the tries.
    """

    bucket: str
    prefix: str = ""
    client: Any = field(default=None, repr=False)
    """A boto3 S3 client (thread-safe, shared by the store's threads); None: `s3_client()`, boto3's defaults."""
    attempts: int = 8
    """Tries per call (tenacity): the one retry layer of an S3 fault."""
    retry_wait_s: float = 0.5
    """First wait between tries; doubles each time, at most `MAX_RETRY_WAIT_S`."""
    link_days: float = MAX_LINK_DAYS
    """How long a presigned link (`link`) opens, in days (at most 7)."""

    def __post_init__(self) -> None:
        check_bucket_name(self.bucket)
        self.prefix = self.prefix.strip("/")
        self.location = f"s3://{_join(self.bucket, self.prefix)}"
        if self.client is None:
            self.client = s3_client()

    def _full(self, key: str) -> str:
        return _join(self.prefix, key)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one S3 call with retries; turn what is left into a StorageError that names the object."""
        from botocore.exceptions import BotoCoreError, ClientError

        retrying = Retrying(
            stop=stop_after_attempt(max(1, self.attempts)),
            wait=wait_exponential(multiplier=self.retry_wait_s, max=MAX_RETRY_WAIT_S),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        try:
            return retrying(fn)
        except (BotoCoreError, ClientError) as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"{what}: no such object") from exc
            tries = retrying.statistics.get("attempt_number", 1)
            raise StorageError(
                f"S3 {what} failed after {tries} {'try' if tries == 1 else 'tries'}: {exc}", retried=tries - 1
            ) from exc

    def put_bytes(self, key: str, data: bytes) -> str:
        full = self._full(key)
        content_type = content_type_of(key)
        self._call(
            f"put s3://{self.bucket}/{full}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=full, Body=data, ContentType=content_type),
        )
        return f"s3://{self.bucket}/{full}"

    def put_file(self, key: str, path: Path) -> str:
        return self.put_bytes(key, Path(path).read_bytes())

    def get_bytes(self, key: str) -> bytes:
        full = self._full(key)
        response = self._call(
            f"get s3://{self.bucket}/{full}", lambda: self.client.get_object(Bucket=self.bucket, Key=full)
        )
        return bytes(response["Body"].read())

    def exists(self, key: str) -> bool:
        full = self._full(key)
        try:
            self._call(
                f"head s3://{self.bucket}/{full}",
                lambda: self.client.head_object(Bucket=self.bucket, Key=full),
            )
        except FileNotFoundError:
            return False
        return True

    def list(self, folder: str = "") -> list[str]:
        full = self._full(folder)
        full = f"{full}/" if full else ""  # the folder, never its siblings: `nightly/`, not `nightly-fail/`
        strip = len(self.prefix) + 1 if self.prefix else 0

        def pages() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return keys

        return sorted(self._call(f"list s3://{self.bucket}/{full}", pages))

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def link(self, key: str) -> Link:
        """A presigned GET of the object (SigV4, `link_days`): it opens in any browser, on a private bucket, for
        whoever has it until it expires. It carries the access key id (not the secret) and a signature for this
        one object; text files are served as UTF-8 text, so a browser shows them rather than saving them."""
        params = {"Bucket": self.bucket, "Key": self._full(key), "ResponseContentType": content_type_of(key)}
        seconds = int(self.link_days * 86400)
        url = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=seconds)
        return Link(url=url, expires=datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds))

    def check_bucket(self) -> bool:
        """Whether the bucket exists, asked once (a check, not a run: no retries). Raises StorageError, naming the
        endpoint and bucket, when nothing answers there or the keys are refused."""
        from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

        where = self.client.meta.endpoint_url
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if status == 404 or exc.response.get("Error", {}).get("Code") in {
                "404",
                "NoSuchBucket",
                "NotFound",
            }:
                return False
            if status in (401, 403):
                raise StorageError(
                    f"the S3 endpoint {where} refused these keys for bucket {self.bucket!r} ({status}): check "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                ) from None
            raise StorageError(
                f"the S3 endpoint {where} answered {status} for bucket {self.bucket!r}: {exc}"
            ) from None
        except ParamValidationError as exc:
            raise ConfigError(f"the S3 bucket {self.bucket!r}: {exc}") from None
        except (BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise StorageError(
                f"nothing answers at the S3 endpoint {where} ({exc}): check AWS_ENDPOINT_URL and that the server "
                "is running"
            ) from None
        return True

    def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist yet (for local S3 servers; on AWS make it yourself)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call(f"create bucket {self.bucket}", lambda: self.client.create_bucket(Bucket=self.bucket))

    def read_uri(self, uri: str) -> bytes:
        """Any s3:// object this store's credentials can read (e.g. a tasks.jsonl in another bucket)."""
        bucket, key = split_s3_uri(uri)
        response = self._call(f"get {uri}", lambda: self.client.get_object(Bucket=bucket, Key=key))
        return bytes(response["Body"].read())


def split_s3_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'key/of/object') from 's3://bucket/key/of/object'; a ConfigError for a bucket name S3 refuses."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"not an s3:// URI: {uri!r} (expected s3://BUCKET/KEY)")
    check_bucket_name(parsed.netloc, where=uri)
    return parsed.netloc, parsed.path.lstrip("/")


_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def check_bucket_name(bucket: str, where: str | None = None) -> None:
    """A ConfigError saying what is wrong with a bucket name S3 would refuse (the general-purpose bucket rules:
    3-63 lowercase letters, digits, dots and hyphens, a letter or digit at each end, no '..', not an IP address)."""
    problem = None
    if not _BUCKET_NAME.match(bucket):
        problem = (
            "a bucket name is 3-63 characters of lowercase letters, digits, dots and hyphens, beginning and ending "
            "with a letter or digit"
        )
    elif ".." in bucket or ".-" in bucket or "-." in bucket:
        problem = "a bucket name has no two dots, or a dot and a hyphen, side by side"
    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", bucket):
        problem = "a bucket name is not an IP address"
    if problem:
        raise ConfigError(
            f"{bucket!r} is not a valid S3 bucket name{f' (in {where})' if where else ''}: {problem}"
        )


#: Files served as UTF-8 text (a browser shows them instead of saving them): the run folder's diffs and logs.
_TEXT_SUFFIXES = (".diff", ".patch", ".log", ".txt", ".jsonl", ".md")


def content_type_of(key: str) -> str:
    """The Content-Type an object is stored and served with: UTF-8 text for diffs and logs, HTML and JSON as
    UTF-8, else what its name says."""
    if key.endswith(_TEXT_SUFFIXES):
        return "text/plain; charset=utf-8"
    guessed = mimetypes.guess_type(key)[0] or "application/octet-stream"
    return f"{guessed}; charset=utf-8" if guessed in ("text/html", "application/json") else guessed


# -- opening a store, reading a URI -------------------------------------------------------------------------------


def open_store(settings: StoreSettings | None = None) -> ArtifactStore:
    """The store that `settings.url` names: `s3://BUCKET/PREFIX` or a local folder."""
    settings = settings or StoreSettings()
    if settings.url.startswith("s3://"):
        bucket, prefix = split_s3_uri(settings.url)
        return S3Store(
            bucket=bucket, prefix=prefix, client=settings_s3_client(settings), attempts=settings.attempts,
            link_days=settings.link_days,
        )  # fmt: skip
    if "://" in settings.url:
        raise ConfigError(
            f"unsupported artifact store {settings.url!r}: use a folder path or s3://BUCKET/PREFIX"
        )
    return LocalStore(settings.url)


def read_text(location: str, store: ArtifactStore | None = None, what: str = "task file") -> str:
    """The text of a local file or an `s3://` object (read with `store`'s credentials when it is an S3Store).

    Used for task files (and their SWE-bench specs files, `what` says which), which may live next to the artifacts
    or anywhere else.
    """
    if location.startswith("s3://"):
        s3 = store if isinstance(store, S3Store) else S3Store(bucket=split_s3_uri(location)[0])
        try:
            return s3.read_uri(location).decode("utf-8")
        except FileNotFoundError as exc:
            endpoint = getattr(s3.client.meta, "endpoint_url", "AWS")
            raise ConfigError(
                f"{what} {location} does not exist (looked for key {location.split('/', 3)[-1]!r} in bucket "
                f"{s3.bucket!r} at {endpoint})"
            ) from exc
    path = Path(location).expanduser()
    if not path.is_file():
        where = (
            f"looked for {path.resolve()} on {socket.gethostname()}"
            if path.is_absolute()
            else f"a path relative to the folder this runs in: looked for {path.resolve()} on "
            f"{socket.gethostname()}; give an absolute path, an s3:// file or a repository"
        )
        raise ConfigError(f"{what} {location} does not exist ({where})")
    return path.read_text(encoding="utf-8")

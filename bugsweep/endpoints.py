"""A model endpoint named in words, as a command line names one: `NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]`, and any of
its settings as `SETTING=VALUE` (bugsweep.runconfig.ModelFields). `bugsweep compare` names its models this way (its
entries, flows.compare.ModelEntry, extend `EndpointEntry`), and `bugsweep solve --escalate-to` the models a run
escalates to.

The key never travels with the entry: it names the environment variable that holds it, read when the endpoint's
settings are made (`EndpointEntry.settings`), never stored, never logged.
"""

from __future__ import annotations

import os
import re
from typing import Self

from pydantic import SecretStr

from bugsweep.errors import ConfigError
from bugsweep.runconfig import ModelChoices, ModelFields, chosen
from bugsweep.settings import ModelSettings

#: What `--model` (and `--escalate-to`) take.
ENDPOINT_FORM = "NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]"
#: The fields an entry always names itself (never from LLM_*).
NAMED = ("base_url", "model")


class EndpointEntry(ModelChoices):  # ModelFields' fields, each unset unless given (bugsweep.runconfig)
    """A model endpoint with a display name: its URL, the model id, the environment variable holding its key, and
    any of its settings (bugsweep.runconfig.ModelFields: temperature, reply limit, prices, ...). What it does not
    give comes from LLM_* (never LLM_BASE_URL, LLM_MODEL or LLM_API_KEY: an entry always names its endpoint,
    model and key), else the default."""

    name: str
    """Shown in the report; also the model id sent to the endpoint unless `model` is set."""
    base_url: str  # an entry always names its endpoint
    """OpenAI-compatible base URL."""
    model: str | None = None  # type: ignore[assignment]  # unset: the entry's name
    """Model id sent to the endpoint; unset: `name`."""
    key_env: str | None = None
    """Environment variable with the API key; unset: no key (fine for self-hosted endpoints)."""

    @classmethod
    def parse(cls, text: str, option: str = "--model") -> Self:
        """`NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]`, e.g. `deepseek-chat=https://api.deepseek.com/v1,DEEPSEEK_API_KEY`;
        a ConfigError naming `option` when `text` is not one."""
        name, sep, rest = text.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ConfigError(f"{option} {text!r}: expected {ENDPOINT_FORM}")
        base_url, _, tail = rest.partition(",")
        key_env_text, _, model_id = tail.partition(",")
        if not re.match(r"^https?://", base_url.strip()):
            raise ConfigError(f"{option} {text!r}: {base_url!r} is not an http(s) URL")
        key_env = key_env_text.strip() or None
        if key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
            raise ConfigError(f"{option} {text!r}: {key_env!r} is not an environment variable name")
        return cls(
            name=name.strip(), base_url=base_url.strip(), key_env=key_env, model=model_id.strip() or None
        )

    def set_endpoint(self, field: str, value: str) -> None:
        """Set one of the endpoint's settings by name, from text (`--model-set`, `--escalate-set`)."""
        if field not in ModelFields.model_fields or field in NAMED:
            known = sorted(set(ModelFields.model_fields) - set(NAMED))
            raise ConfigError(
                f"{field!r} is not a setting of a model endpoint: choose one of {', '.join(known)}"
            )
        checked = ModelChoices.model_validate({field: value})
        setattr(self, field, getattr(checked, field))

    def settings(self) -> ModelSettings:
        """ModelSettings for this endpoint, with the key read from its variable now (never stored, never logged):
        the fields it gives over LLM_* over the defaults."""
        key = ""
        if self.key_env:
            key = os.environ.get(self.key_env, "")
            if not key:
                raise ConfigError(f"model {self.name!r}: environment variable {self.key_env} is not set")
        given = chosen(self, set(ModelFields.model_fields) - set(NAMED))
        return ModelSettings(
            **given, base_url=self.base_url, model=self.model or self.name, api_key=SecretStr(key)
        )


def parse_endpoints(
    texts: list[str], settings: list[str], option: str, set_option: str
) -> list[EndpointEntry]:
    """The entries of `option` (each `NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]`), with each `NAME:SETTING=VALUE` of
    `set_option` on the entry of that name. A ConfigError names the option and the text that is wrong."""
    from pydantic import ValidationError

    entries = [EndpointEntry.parse(text, option) for text in texts]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"{option}: names must be unique: {names}")
    by_name = {e.name: e for e in entries}
    for text in settings:
        name, _, assignment = text.partition(":")
        field, sep, value = assignment.partition("=")
        if name not in by_name or not sep:
            raise ConfigError(
                f"{set_option} {text!r}: expected NAME:SETTING=VALUE for one of the {option} names"
            )
        try:
            by_name[name].set_endpoint(field.strip(), value.strip())
        except (ConfigError, ValidationError) as exc:
            problem = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise ConfigError(f"{set_option} {text!r}: {problem}") from None
    return entries

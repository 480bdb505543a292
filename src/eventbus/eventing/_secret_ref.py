"""A secret by reference (``{secret: NAME}``, ``{env: NAME}``, ``{file: PATH}``), resolved where
it is used: pipeline records, logs and error messages carry the reference, never the value."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from eventbus._internal.secret_store import NAME_PATTERN as SECRET_NAME
from eventbus.errors import ConfigError

__all__ = ["SecretRef"]


class SecretRef(BaseModel):
    """A secret by reference, never the value itself: ``{secret: NAME}`` (stored on the stack
    with ``eventbus secret set NAME``, encrypted in Redis), ``{env: NAME}`` (an environment
    variable where it is used) or ``{file: PATH}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: Annotated[str, StringConstraints(pattern=SECRET_NAME)] | None = Field(
        default=None,
        description="Name of a secret stored on the stack (`eventbus secret set NAME`).",
    )
    env: str | None = Field(
        default=None, min_length=1, description="Name of the environment variable holding it."
    )
    file: str | None = Field(
        default=None, min_length=1, description="Path of a file holding it (trailing newline cut)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if sum(x is not None for x in (self.secret, self.env, self.file)) != 1:
            msg = "a secret reference takes exactly one of secret: NAME, env: NAME or file: PATH"
            raise ValueError(msg)
        return self

    def describe(self) -> str:
        """Where the secret comes from (``env KAFKA_PASSWORD``), safe to log."""
        if self.secret is not None:
            return f"secret {self.secret}"
        return f"env {self.env}" if self.env is not None else f"file {self.file}"

    def problem(self, what: str) -> str | None:
        """Why the secret cannot be read here, naming the reference; None when it can (a
        ``{secret: NAME}`` is checked where the stack's secrets are: ``deploy``)."""
        if self.secret is not None:
            return None
        if self.env is not None:
            if os.environ.get(self.env) is None:
                return f"{what}: environment variable {self.env} is not set; export it"
            return None
        assert self.file is not None
        if not os.access(self.file, os.R_OK):
            return f"{what}: file {self.file} does not exist or is not readable; create it"
        return None

    def resolve(self, what: str) -> str:
        """The secret's value.

        Raises:
            ConfigError: the variable is unset, the file unreadable or the stack's secret
                missing (the message names the reference, never a value).
        """
        if self.secret is not None:
            from eventbus._internal.secret_store import lookup

            try:
                return lookup(self.secret).decode()
            except ConfigError as e:
                raise ConfigError(f"{what}: {e}") from None
        problem = self.problem(what)
        if problem is not None:
            raise ConfigError(problem)
        if self.env is not None:
            return os.environ[self.env]
        assert self.file is not None
        return Path(self.file).read_text().rstrip("\r\n")

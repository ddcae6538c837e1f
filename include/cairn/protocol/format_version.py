"""The format version every token, claim and manifest carries.

Files outlive the code that wrote them: a deployment reads tokens written years ago, and two
deployments of different versions may share one archive root for a while. So each of these
objects says which format it is in. This Cairn reads every version up to `FORMAT_VERSION`
(files written before the field existed are version 1) and refuses a newer one loudly, naming
the file, instead of misreading it or taking it for absent: a newer format may mean something
this code cannot honour (a claim it would sweep, a token it would count wrong).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, PositiveInt, ValidationError, model_validator

from cairn.errors import PermanentError
from cairn.storage.objects import Storage

FORMAT_VERSION = 1
"""The newest format this code reads, and the one it writes."""


class NewerFormat(PermanentError):
    """An object was written by a newer Cairn, in a format this one cannot read."""


class Versioned(BaseModel):
    """A stored protocol object: its format version, checked before anything else is read."""

    format_version: PositiveInt = FORMAT_VERSION
    """The format it was written in (absent in files written before Cairn recorded it: 1)."""

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        found = data.get("format_version", 1) if isinstance(data, dict) else 1
        if isinstance(found, int) and found > FORMAT_VERSION:
            raise NewerFormat(
                f"a {cls.__name__.lower()} in format {found} was written by a newer Cairn (this one"
                f" reads formats up to {FORMAT_VERSION}): upgrade every deployment that shares"
                " this archive root"
            )
        return data


@contextlib.contextmanager
def naming(key: str) -> Iterator[None]:
    """Reading the object at `key`: a NewerFormat says which file it is."""
    try:
        yield
    except NewerFormat as err:
        raise NewerFormat(f"{key}: {err}") from None


V = TypeVar("V", bound=Versioned)


def load(storage: Storage, key: str, model: type[V], unreadable: type[Exception], what: str) -> V:
    """The `model` stored at `key`; `unreadable` (saying it is the `what` at `key`) if it is not
    one, NewerFormat naming `key` if a newer Cairn wrote it."""
    try:
        with naming(key):
            return model.model_validate_json(storage.read(key))
    except (ValidationError, ValueError) as err:
        raise unreadable(f"{what} {key} is unreadable: {err}") from None

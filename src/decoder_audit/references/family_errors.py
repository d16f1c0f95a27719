"""The two ways a family's config fails to be read (references/families.py): a value no model
computes with, and one we do not express. Raised by the functions the entries read fields
through (families_*.py, hf_latent.py) and caught by the reader (hf_config.py), none of which
needs the table for it."""

from __future__ import annotations

from ..errors import ConfigError


class InvalidHFConfig(ConfigError):
    """A config whose values no model computes with (not one we merely cannot express): the
    model is refused, never audited as a black box."""


class Unexpressed(Exception):
    """Raised by an entry's function of the config: what it reads is not expressed (the
    message names the field and its value); the reader lists it among the refusals."""

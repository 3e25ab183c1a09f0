"""The error of a conversion that cannot be done as asked."""

from __future__ import annotations


class ConversionError(ValueError):
    """A source or an option that cannot be converted; the message names the tensor, field or file at fault."""

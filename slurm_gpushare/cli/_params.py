"""Option types the command modules share (a module without commands: not in the index)."""

from __future__ import annotations

import math

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (FloatRange lets them through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number

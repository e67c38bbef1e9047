"""Alias of `dapo_trl.run.data`, kept so that `from dapo_trl.data import ...` keeps working."""

import sys

from .run import data as _module

sys.modules[__name__] = _module

"""Alias of `dapo_trl.run.evaluation`, kept so that `python -m dapo_trl.evaluation` keeps working."""

import sys

from .run import evaluation as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module

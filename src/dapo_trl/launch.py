"""Alias of `dapo_trl.run.launch`, kept so that `python -m dapo_trl.launch` keeps working."""

import sys

from .run import launch as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module

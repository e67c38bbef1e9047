"""Alias of `dapo_trl.run.launch`, kept so that `python -m dapo_trl.launch` and `import dapo_trl.launch` keep working."""

import runpy
import sys

if __name__ == "__main__":  # run the module itself as the program, exit code and all
    runpy.run_module("dapo_trl.run.launch", run_name="__main__", alter_sys=True)
else:
    from .run import launch as _module

    sys.modules[__name__] = _module

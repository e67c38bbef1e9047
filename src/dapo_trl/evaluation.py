"""Alias of `dapo_trl.run.evaluation`, kept so that `python -m dapo_trl.evaluation` and `import dapo_trl.evaluation` keep working."""

import runpy
import sys

if __name__ == "__main__":  # run the module itself as the program, exit code and all
    runpy.run_module("dapo_trl.run.evaluation", run_name="__main__", alter_sys=True)
else:
    from .run import evaluation as _module

    sys.modules[__name__] = _module

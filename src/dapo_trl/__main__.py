"""`python -m dapo_trl COMMAND ...`: the `dapo-trl` command (see `dapo_trl.run.entry`)."""

from .run.entry import main

if __name__ == "__main__":
    main()

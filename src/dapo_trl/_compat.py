"""The TRL range dapo-trl is tested against, checked at import with a message that names both versions."""

from __future__ import annotations

import os
import warnings
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED_TRL = SpecifierSet(">=1.16.0,<1.17")
SKIP_ENV = "DAPO_TRL_SKIP_VERSION_CHECK"


def check_trl_version(installed: str | None = None) -> None:
    """
    Raise `ImportError` when the installed TRL is outside [`SUPPORTED_TRL`].

    DAPOTrainer overrides a few TRL methods whose signatures and behaviour are pinned by tests for this range; another
    TRL may work, or may silently compute something else. Set `DAPO_TRL_SKIP_VERSION_CHECK=1` to turn the error into a
    warning at your own risk.
    """
    if installed is None:
        try:
            installed = metadata.version("trl")
        except metadata.PackageNotFoundError as error:
            raise ImportError(f"dapo-trl needs trl{SUPPORTED_TRL}, which is not installed.") from error
    if Version(installed) in SUPPORTED_TRL:
        return
    message = (
        f"dapo-trl supports trl{SUPPORTED_TRL} but trl {installed} is installed. Install a supported TRL with "
        f"`pip install 'trl{SUPPORTED_TRL}'`, or set {SKIP_ENV}=1 to try this one anyway."
    )
    if os.environ.get(SKIP_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise ImportError(message)

"""DAPO for Hugging Face TRL: decoupled clipping, dynamic sampling, token-level loss and overlong shaping."""

__version__ = "0.1.0"

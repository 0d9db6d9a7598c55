"""dsv4deploy: declarative, gated deployment of DeepSeek-V4-Flash on SGLang."""

from importlib.resources import files

__version__ = "0.1.0"

PACKAGE_DATA = files(__name__) / "data"

"""The chat's widgets, each with its Textual CSS in a .tcss file of the same name."""

from pathlib import Path

CSS_FILES = sorted(str(path) for path in Path(__file__).parent.glob("*.tcss"))

"""The package version, in a module of its own so that any module can read it
without importing the package (``pyproject.toml`` states the same string;
tests/api/test_module_structure.py checks that they agree)."""

__version__ = "0.1.0"

"""The package's version, in a module of its own so that any module can read it without importing ``gradian``'s
public names (``from gradian.version import __version__``).
"""

__version__ = "0.1.0"

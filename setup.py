"""Builds the optional native verifier (ledger/_cverify.c); everything else is in pyproject.toml.

The extension is optional: without a C compiler or the SQLite and OpenSSL
headers the install still succeeds and ``ledger verify`` uses its Python path.
"""

from setuptools import Extension, setup

NATIVE_VERIFIER = Extension(
    "ledger._cverify",
    sources=["ledger/_cverify.c"],
    libraries=["sqlite3", "crypto"],
    optional=True,
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)

setup(ext_modules=[NATIVE_VERIFIER])

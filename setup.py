"""Builds the optional native parts (ledger/_cverify.c, ledger/_cseal.c); the rest is in pyproject.toml.

Both extensions are optional: without a C compiler or the SQLite and OpenSSL
headers the install still succeeds, ``ledger verify`` uses its Python path and
append seals in Python.
"""

from setuptools import Extension, setup

COMPILE_ARGS = ["-O2", "-Wall", "-Wextra"]

NATIVE_VERIFIER = Extension(
    "ledger._cverify",
    sources=["ledger/_cverify.c"],
    depends=["ledger/_native.h"],
    libraries=["sqlite3", "crypto"],
    optional=True,
    extra_compile_args=COMPILE_ARGS,
)

NATIVE_SEALER = Extension(
    "ledger._cseal",
    sources=["ledger/_cseal.c"],
    depends=["ledger/_native.h"],
    libraries=["crypto"],
    optional=True,
    extra_compile_args=COMPILE_ARGS,
)

setup(ext_modules=[NATIVE_VERIFIER, NATIVE_SEALER])

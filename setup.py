"""Builds the optional native parts (ledger/_cverify.c, ledger/_cseal.c, ledger/_carrow.c).

The rest is in pyproject.toml. Every extension is optional: without a C compiler
or the SQLite and OpenSSL headers the install still succeeds, ``ledger verify``
uses its Python path, append seals in Python and the snapshot reads rows
through Python's sqlite3.
"""

from setuptools import Extension, setup

COMPILE_ARGS = ["-O2", "-Wall", "-Wextra"]

NATIVE_VERIFIER = Extension(
    "ledger._cverify",
    sources=["ledger/_cverify.c"],
    depends=["ledger/_native.h", "ledger/_buffer.h", "ledger/_rowcheck.h"],
    libraries=["sqlite3", "crypto"],
    optional=True,
    extra_compile_args=COMPILE_ARGS,
)

NATIVE_SEALER = Extension(
    "ledger._cseal",
    sources=["ledger/_cseal.c"],
    depends=["ledger/_native.h", "ledger/_buffer.h", "ledger/_rowcheck.h"],
    # SQLite: the batch's insert on the connection Python's sqlite3 module opened.
    libraries=["crypto", "sqlite3"],
    optional=True,
    extra_compile_args=COMPILE_ARGS,
)

# Reads a SQLite ledger's rows into Arrow buffers for the Parquet snapshot (ledger/_rows.py), checking
# each row's digest and chain link as it reads a segment's rows (ledger/_snapshot.py).
NATIVE_ARROW_READER = Extension(
    "ledger._carrow",
    sources=["ledger/_carrow.c"],
    depends=["ledger/_native.h", "ledger/_buffer.h", "ledger/_rowcheck.h"],
    libraries=["sqlite3", "crypto"],
    optional=True,
    extra_compile_args=COMPILE_ARGS,
)

setup(ext_modules=[NATIVE_VERIFIER, NATIVE_SEALER, NATIVE_ARROW_READER])

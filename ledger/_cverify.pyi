# Types of the native verifier (ledger/_cverify.c).
OK: int
DELETED: int
EDITED: int
RELINKED: int

def scan(
    path: str, after: int, last: int, expected: int, previous_chain: str, /
) -> tuple[int, int, int, int, str]: ...

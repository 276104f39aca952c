# Types of the native row reader (ledger/_carrow.c).

def read(
    path: str, after_seq: int, until_seq: int, /
) -> tuple[int, bytes, list[tuple[bytes | None, int, bytes, bytes]]]: ...

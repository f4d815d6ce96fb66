"""Type stub of the compiled word scan (``pipeline/clean/_wordscan.c``)."""

def scan_words(
    texts: list[str],
    max_dup_line_fraction: float,
    max_dup_line_char_fraction: float,
    max_dup_para_fraction: float,
    max_dup_para_char_fraction: float,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]: ...

"""Text from someone else's file, made safe to print: its control characters escaped.

A newline in a tensor path would split one reported problem over two lines, and an escape
sequence in a session's reason or a manifest's case name would clear a terminal or forge a
verdict line. Without numpy or h5py, so a command line can use it before they load.
"""


def printable(text: str) -> str:
    """`text` with each control character written as its Python escape (\\n, \\x1b)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_lines(text: str) -> str:
    """`text` with each control character but its line breaks written as its escape: a text of
    several lines (a report, a page) made of someone else's names."""
    return "\n".join(printable(line) for line in text.split("\n"))



def one_line(text: str, limit: int = 600) -> str:
    """Someone else's message of several lines (mlx-lm names each parameter it did not expect on
    a line of its own) as the one line a refusal is, its control characters escaped."""
    return excerpt(printable(" ".join(part.strip() for part in text.splitlines() if part.strip())), limit)


def excerpt(text: str, limit: int) -> str:
    """`text`, cut after `limit` characters with how long it is: a prompt may be 60 MB, which a
    table cell laid out for 90 s and an HTML page carried whole, twice."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters in all)"

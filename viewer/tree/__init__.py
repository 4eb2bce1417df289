"""The alignment tree: every aligned op and unaligned record, coloured by its verdict."""

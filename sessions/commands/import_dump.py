"""`parity-xray import KIND SOURCE --out X.h5`: a capture from tensors an engine already dumped.

KIND is `safetensors` (one file), `npz` (one archive) or `dir` (a directory of .npy/.bin files
with a manifest.json). docs/importers.md walks through each. Exit status: 0 on success, 2 when
the input is refused (the message names the file and the manifest entry).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from pathlib import Path

from sessions.capture.abandoned_writes import remove_abandoned_writes
from sessions.capture.format import ROLES
from sessions.capture.reader import CaptureError
from sessions.ctrl_c import raise_if_pressed
from sessions.file_room import FileUnwritable
from sessions.importers import KINDS, iter_import
from sessions.printable import printable

EXIT_OK = 0
EXIT_REFUSED = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="what SOURCE is")
    parser.add_argument("source", type=Path, metavar="SOURCE", help="the .safetensors / .npz file, or the directory")
    parser.add_argument("--out", type=Path, required=True, metavar="X.h5", help="capture to write (must not exist)")
    parser.add_argument("--manifest", type=Path, metavar="JSON", help="manifest (default for dir: SOURCE/manifest.json)")
    parser.add_argument("--role", choices=ROLES, help="capture role (default: the manifest's, else native)")
    parser.add_argument("--engine-name", help="engine name recorded in the capture")
    parser.add_argument("--model-id", help="model id recorded in the capture")


def run(args: argparse.Namespace) -> int:
    overrides = {"role": args.role, "engine_name": args.engine_name, "model_id": args.model_id}
    for abandoned in remove_abandoned_writes(args.out):
        print(f"import: {abandoned.text(args.out)}", file=sys.stderr)
    try:
        count = 0
        with closing(iter_import(args.kind, args.source, args.out, manifest=args.manifest, meta=overrides)) as work:
            for _ in work:
                count += 1
                raise_if_pressed()
    except (CaptureError, FileUnwritable) as exc:
        print(f"import refused: {printable(str(exc))}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{printable(str(args.out))}: imported {count} tensor{'s' if count != 1 else ''} from {printable(str(args.source))}")
    return EXIT_OK

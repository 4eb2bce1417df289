"""`parity-xray record llama|mlx ...`: capture a real engine's run.

    parity-xray record llama MODEL.gguf --tokens 1,2,3 [--decode-steps N] [--all-nodes] [--whole-cache] [--batch N --batch-row R] --out X.h5
    parity-xray record mlx MODEL_DIR --tokens 1,2,3 [--decode-steps N] [--batch N --batch-row R] --out X.h5

Engine libraries (llama_cpp, mlx_lm) are imported only when a recording runs, so listing the
subcommands never loads them. docs/recorders.md explains what each recorder writes.
llama.cpp runs in a child process (backends.recorders.llama_process): if it crashes (an
instruction this CPU does not grant, a failed GGML_ASSERT), the command prints what happened
and what to do instead of dying with it.
Exit status: 0 recorded, 2 refused (bad arguments, unloadable model, layout self-check failed),
3 the engine crashed, 130 interrupted (Ctrl-C: the capture keeps the steps written so far).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from backends.recorders.left_behind import left_at
from sessions.capture.format import ROLES
from sessions.commands.arguments import output_problem
from sessions.ctrl_c import exit_code_of, raise_if_pressed, said
from sessions.file_room import FileUnwritable
from sessions.printable import one_line, printable, printable_lines
from sessions.progress import Progress
from sessions.side_file import disk_stamp

if TYPE_CHECKING:
    from backends.recorders.record_schedule import TokenSchedule

EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_CRASHED = 3
KV_CHOICES = ("f32", "f16", "bf16", "q8_0")


INSTALL_LLAMA = "`make llama` builds it into this checkout's .venv (`parity-xray doctor --for llama` then checks the build)"
MAX_WEIGHTS_ID = 256
"""The longest --weights-hash: an id, not a document."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engines = parser.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    llama = engines.add_parser("llama", help="llama.cpp through llama-cpp-python's eval callback")
    llama.add_argument("model", type=Path, metavar="MODEL.gguf", help="the GGUF file llama.cpp loads")
    mlx = engines.add_parser("mlx", help="any mlx-lm model from a local directory")
    mlx.add_argument("model", type=Path, metavar="MODEL_DIR", help="an mlx-lm model folder (config.json and safetensors)")
    for sub, role in ((llama, "native"), (mlx, "oracle")):
        sub.add_argument("--tokens", required=True, help="prompt token ids, e.g. 1,2,3")
        sub.add_argument("--decode-steps", type=int, default=0, metavar="N", help="greedy decode steps after the prefill (default 0: the prefill alone)")
        sub.add_argument("--ubatch", type=int, default=512, metavar="N", help="prefill micro-batch size (each piece is a segment)")
        sub.add_argument(
            "--segments", default="", metavar="SIZES",
            help="cut the prefill into cache-preserving calls, e.g. 5,1008,14 or text-before=5,visual=1008,text-after=14 (default: one call)",
        )
        sub.add_argument("--feed-last", type=int, default=0, metavar="K", help="feed the prompt's last K tokens one call each, as decode would")
        sub.add_argument("--repeat", type=int, default=1, metavar="K", help="record the same run K times (X.h5, X.run2.h5, ...): run-to-run determinism")
        sub.add_argument("--stop-tokens", default="", metavar="IDS", help="token ids that end the run (marked is_stop)")
        sub.add_argument("--role", choices=ROLES, default=role, help=f"capture role (default {role})")
        sub.add_argument("--out", type=Path, required=True, metavar="X.h5", help="the capture to write (refused if it exists, unless --force)")
        sub.add_argument("--force", action="store_true", help="replace X.h5 if it exists")
        sub.add_argument(
            "--weights-hash",
            metavar="ID",
            help="the capture's weights hash instead of the model files' SHA-256 (kept in provenance either way): give a GGUF "
            "and a safetensors run of the same weights one id, since their files hash differently",
        )
    llama.add_argument("--all-nodes", action="store_true", help="record every graph node, not only named or weight-anchored ones (the KV cache's views only with --whole-cache)")
    llama.add_argument(
        "--whole-cache", action="store_true",
        help="record the whole KV cache in each of its views at every step (quadratic); default: the cells each step wrote",
    )
    llama.add_argument("--kv-type", choices=KV_CHOICES, default="f32", help="KV cache type (parity default f32)")
    llama.add_argument("--flash-attn", action="store_true", help="turn flash attention on (parity default off)")
    llama.add_argument("--threads", type=int, default=2, metavar="N", help="llama.cpp CPU threads (default 2)")
    llama.add_argument(
        "--no-extra-bufts", dest="extra_bufts", action="store_false",
        help="keep weights out of llama.cpp's repacked extra buffer types (no AMX / repacked kernels)",
    )  # fmt: skip
    mlx.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where MLX computes (default cpu)")
    for sub in (llama, mlx):
        sub.add_argument(
            "--batch", type=int, default=1, metavar="N",
            help="run the prompt inside a batch of N equally long requests (batch invariance); llama.cpp: one sequence each",
        )
        sub.add_argument("--batch-row", type=int, default=0, metavar="R", help="the prompt's row in the batch (default 0)")


def repeat_paths(out: Path, repeat: int) -> list[Path]:
    """Where `--repeat K` writes: X.h5, then X.run2.h5 ... X.runK.h5."""
    return [out] + [out.with_name(f"{out.stem}.run{k}{out.suffix}") for k in range(2, repeat + 1)]


def _model_files(model: Path) -> dict[str, str | Path | None]:
    """What a recording reads: the GGUF file, or every file of the model directory (its weights,
    config, tokenizer), which an output must never replace."""
    if model.is_dir():
        try:
            return {f"model's {path.name}": path for path in model.iterdir() if path.is_file()}
        except OSError:
            return {}
    return {"model": model}


def _inside_model(outputs: dict[str, str], model: Path) -> str | None:
    """Why an output may not go into the model's folder, new file or not: it becomes one of the
    model's files, which the next recording of the model reads and then refused to replace."""
    if not model.is_dir():
        return None
    folder = model.resolve()
    for option, output in outputs.items():
        if Path(output).resolve().parent == folder:  # a subfolder's files are none of the model's
            return f"{option} {output} is inside the model's folder {model}: a capture never goes among a model's files"
    return None


def run(args: argparse.Namespace) -> int:
    from backends.recorders.llama_process import LlamaCrashed
    from backends.recorders.record_schedule import (
        TokenSchedule,
        parse_segments,
        parse_token_list,
    )

    try:
        if args.repeat < 1:
            raise ValueError(f"--repeat must be at least 1, not {args.repeat}")
        if args.weights_hash is not None and not (0 < len(args.weights_hash) <= MAX_WEIGHTS_ID and args.weights_hash.isprintable()):
            raise ValueError(f"--weights-hash must be 1 to {MAX_WEIGHTS_ID} printable characters, e.g. sha256:<hex>, not {args.weights_hash!r}")
        schedule = TokenSchedule(
            tuple(parse_token_list(args.tokens, "--tokens")),
            args.decode_steps,
            args.ubatch,
            frozenset(parse_token_list(args.stop_tokens, "--stop-tokens")) if args.stop_tokens.strip() else frozenset(),
            parse_segments(args.segments) if args.segments.strip() else (),
            args.feed_last,
        )
    except ValueError as exc:
        print(f"record refused: {printable_lines(str(exc))}", file=sys.stderr)
        return EXIT_REFUSED
    outs = repeat_paths(args.out, args.repeat)
    outputs = {("--out" if k == 0 else f"--repeat's run {k + 1}"): str(out) for k, out in enumerate(outs)}
    problem = output_problem(outputs, _model_files(args.model)) or _inside_model(outputs, args.model)
    if problem is not None:
        print(f"record refused: {printable_lines(problem)}", file=sys.stderr)
        return EXIT_REFUSED
    if args.engine == "llama" and importlib.util.find_spec("llama_cpp") is None:
        print(f"record refused: llama-cpp-python is not installed here: {INSTALL_LLAMA}", file=sys.stderr)
        return EXIT_REFUSED
    taken = [out for out in outs if out.exists()]
    if taken and not args.force:
        print(f"record refused: {printable(str(taken[0]))} already exists (--force replaces it)", file=sys.stderr)
        return EXIT_REFUSED
    speaking = True
    for out in outs:
        before = disk_stamp(out)
        try:
            shown = None
            for progress in _work(args, schedule, out):
                if speaking and progress != shown:  # the child's latest progress comes again while it is quiet
                    speaking = _progress_line(f"  {printable(progress.label)} ({progress.done}/{progress.total})")
                    shown = progress
                raise_if_pressed()
        except LlamaCrashed as exc:
            print(f"record failed: {printable_lines(str(exc))}", file=sys.stderr)
            return EXIT_CRASHED
        except KeyboardInterrupt as stop:
            print(f"record {said(stop, 'interrupted')}: {left_at(out, before)}", file=sys.stderr)
            return exit_code_of(stop)
        except FileUnwritable as exc:  # a full disk: its words say what is left at the path
            print(f"record failed: {printable_lines(str(exc))}", file=sys.stderr)
            return EXIT_REFUSED
        except (ValueError, RuntimeError, OSError, ImportError) as exc:  # an engine's own words, naming files or fields of the model
            print(f"record refused: {one_line(str(exc))}", file=sys.stderr)
            return EXIT_REFUSED
        if speaking:
            speaking = _progress_line(f"{printable(str(out))}: recorded {args.engine} run of {printable(str(args.model))}")
    return EXIT_OK


def _progress_line(text: str) -> bool:
    """Whether standard output took the line. A reader gone (`| head -1`) or a full disk there
    must not stop a recording, which goes on without its lines: taken as a refusal, it left a
    half-written capture and "record refused: Broken pipe"."""
    try:
        print(text, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left to write, the interpreter's last flush included, goes nowhere
        return False
    return True


def _work(args: argparse.Namespace, schedule: "TokenSchedule", out: Path) -> Iterator[Progress]:
    if args.engine == "llama":
        from backends.recorders.llama_process import iter_record_llama
        from backends.recorders.llama_recorder import LlamaSettings

        settings = LlamaSettings(
            flash_attn=args.flash_attn, kv_type=args.kv_type, n_threads=args.threads, all_nodes=args.all_nodes,
            whole_cache=args.whole_cache, extra_bufts=args.extra_bufts,
        )  # fmt: skip
        return iter_record_llama(
            args.model, schedule, out, settings, role=args.role, weights_hash=args.weights_hash, batch=args.batch, batch_row=args.batch_row
        )
    from backends.recorders.mlx_recorder import iter_record_mlx

    return iter_record_mlx(
        args.model, schedule, out, role=args.role, device=args.device, weights_hash=args.weights_hash, batch=args.batch, batch_row=args.batch_row
    )

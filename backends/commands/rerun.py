"""`parity-xray rerun NATIVE ORACLE --op KEY`: recompute one captured op or segment through MLX.

KEY is `STEP:SEGMENT:LAYER:OP[#OCCURRENCE]` in canonical terms (docs/rerun.md), e.g.
`0:visual:0:sdpa`, `2:decode:1:ffn_act`, or a segment: `0:text-after:0:attention_block`,
`0:visual:1:decoder_layer`. Final-norm and logits keys use layer -1 (`0:visual:-1:logits`).

Exit codes: 0 the rerun reproduces the bits of the side whose route it followed, for every
op; 1 it ran and does not; 2 it could not run (a missing input, an unreadable capture, a bad
option), with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from backends.diagnosis.candidates import metrics_cell
from backends.rerun import ops as rerun_ops
from backends.rerun.capture_out import save_rerun
from backends.rerun.inputs import (
    RerunInputError,
    files_named,
    files_read,
)
from backends.rerun.segment import (
    SIDES,
    RerunOptions,
    RerunResult,
    iter_rerun,
    rerun_target,
)
from backends.rerun.weights import named_weights_problem
from sessions.capture.abandoned_writes import remove_abandoned_writes
from sessions.capture.opening import open_complete_capture
from sessions.capture.reader import CaptureError
from sessions.commands.arguments import (
    add_align_argument,
    end_unusable,
    non_empty,
    output_problem,
    write_outputs,
)
from sessions.compare.json_plain import plain
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import ProfileError
from sessions.compare.result_cache import iter_compare_cached
from sessions.progress import run_to_end

EXIT_REPRODUCED, EXIT_DIFFERS, EXIT_UNUSABLE = 0, 1, 2
FIGURE_WIDTH = 34
"""A figure column's width: "27,961 differ · max 29,937 ULP", a real op's, fits with room."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("native", type=non_empty, help="capture of the engine under test")
    parser.add_argument("oracle", type=non_empty, help="capture of the reference engine")
    parser.add_argument("--op", required=True, metavar="KEY", help="STEP:SEGMENT:LAYER:OP, e.g. 0:visual:0:sdpa or 0:visual:0:decoder_layer")
    parser.add_argument("--from", dest="source", choices=SIDES, default="oracle", help="whose captured inputs to rerun (default oracle)")
    parser.add_argument("--route-from", choices=SIDES, help="whose route (attention contract, SwiGLU order) to follow (default: the --from side)")
    parser.add_argument(
        "--head-chunk", choices=("recorded", "on", "off"), default="recorded",
        help="MTPLX head-chunk rule for SDPA (default: as the route side's recorded calls; the rule where none were recorded)",
    )
    parser.add_argument("--chunk-limit", type=int, default=32, help="the rule's row x head limit (default 32)")
    parser.add_argument("--dtype", choices=tuple(rerun_ops.DTYPES), help="compute dtype (default: as captured)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="MLX device (gpu only where MLX has one)")
    parser.add_argument("--attention-route", choices=rerun_ops.ATTENTION_ROUTES, help="override the attention reduction")
    parser.add_argument("--swiglu-order", choices=rerun_ops.SWIGLU_ORDERS, help="override the SwiGLU evaluation order")
    parser.add_argument("--weights", type=non_empty, metavar="FILE", help="safetensors or GGUF weights (default: the file the capture references)")
    parser.add_argument("--native-profile", help="built-in profile name or TOML path (default: detected); the pair is aligned as `report` aligns it")
    parser.add_argument("--oracle-profile", help="built-in profile name or TOML path (default: detected)")
    add_align_argument(parser)
    parser.add_argument("--save", type=non_empty, metavar="RERUN.h5", help="save the rerun as a capture with role 'rerun'")
    parser.add_argument("--json", type=non_empty, metavar="OUT", help="also write the result as JSON")


def options_from(args: argparse.Namespace) -> RerunOptions:
    return RerunOptions(
        source=args.source,
        route_from=args.route_from,
        head_chunk=None if args.head_chunk == "recorded" else args.head_chunk == "on",
        chunk_limit=args.chunk_limit,
        dtype=args.dtype,
        device=args.device,
        attention_route=args.attention_route,
        swiglu_order=args.swiglu_order,
        weights_path=args.weights,
    )


def result_to_dict(result: RerunResult) -> dict[str, Any]:
    route_side = result.options.route_from or result.options.source
    return {
        "format": "parity-xray-rerun",
        "version": 1,
        "key": result.target.text(),
        "reproduces": {side: result.reproduces(side) for side in SIDES},
        "route_side": route_side,
        **{k: v for k, v in plain(result, omit=frozenset({"bits"})).items() if k not in ("target", "source_meta")},
    }


def render(result: RerunResult) -> str:
    lines = [
        result.verdict(),
        "",
        f"rerun of {result.target.text()} from the {result.options.source} capture's inputs",
        f"device {result.device} (MLX {result.mlx_version}); route: {result.route_text()}",
        f"weights from {', '.join(result.weights_from)}" if result.weights_from else "weights: none taken (no op of this rerun multiplies by one)",
        "",
        f"{'op':<14} {'route':<44} {'native vs oracle':<{FIGURE_WIDTH}} {'rerun vs native':<{FIGURE_WIDTH}} {'rerun vs oracle':<{FIGURE_WIDTH}} closer to exact",
    ]
    for op in result.ops:
        closer = op.closer + ("" if op.inputs_agree is not False else " (inputs differ)")
        lines.append(
            f"{op.key.op:<14} {op.route[:44]:<44} {metrics_cell(op.three_way['native vs oracle']):<{FIGURE_WIDTH}} "
            f"{metrics_cell(op.three_way['rerun vs native']):<{FIGURE_WIDTH}} {metrics_cell(op.three_way['rerun vs oracle']):<{FIGURE_WIDTH}} {closer}"
        )
        for routed in op.calls:
            call = routed.call
            group = "all KV groups" if call.kv_group == -1 else f"KV group {call.kv_group}"
            lines.append(
                f"{'':<14} call: {group}, heads {call.head_start}..{call.head_start + call.head_count - 1}, "
                f"{call.q_rows} rows x {call.kv_len} kv -> {routed.primitive} here, Metal would take {routed.metal_primitive}"
            )
    lines += ["", *result.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    outputs = {"--save": args.save, "--json": args.json}
    inputs = files_named(args.native, args.oracle, args.weights, (args.native_profile, args.oracle_profile))

    def unusable(message: str) -> int:
        return end_unusable("rerun", message, outputs, inputs)  # `inputs` as known when it ends

    named = named_weights_problem(args.weights)
    if named is not None:
        return unusable(named)
    try:
        key = rerun_target(args.op)
        options = options_from(args)
        compare = CompareOptions(native_profile=args.native_profile, oracle_profile=args.oracle_profile, alignment=args.align)
        with open_complete_capture(args.native) as native, open_complete_capture(args.oracle) as oracle:
            inputs = files_read(native, oracle, args.weights, (args.native_profile, args.oracle_profile))
            problem = output_problem(outputs, inputs)
            if problem is not None:
                raise ValueError(problem)
            comparison = run_to_end(iter_compare_cached(native, oracle, compare))
            result = run_to_end(iter_rerun(native, oracle, comparison, key, options))
        if args.save:
            for abandoned in remove_abandoned_writes(Path(args.save)):
                print(f"parity-xray rerun: {abandoned.text(Path(args.save))}", file=sys.stderr)
            save_rerun(result, args.save)
    except (RerunInputError, CaptureError, ProfileError, rerun_ops.RerunOpError, ValueError, OSError) as exc:
        return unusable(str(exc))
    problem = write_outputs([(args.json, lambda: json.dumps(result_to_dict(result), indent=1, allow_nan=False))])
    print(render(result))  # after the document: see `report`
    if problem is not None:
        return unusable(problem)
    if args.save:
        print(f"saved as {args.save} (role rerun)")
    return EXIT_REPRODUCED if result.reproduces(options.route_from or options.source) else EXIT_DIFFERS

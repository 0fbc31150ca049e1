"""`alpamayo ask`: answer a question about camera frames (VQA: Alpamayo 1.5 and 2 Super)."""

from __future__ import annotations

import argparse
import json

from alpamayo.commands.common import add_model_args, add_request_args, load_vla
from alpamayo.inputs import read_frames


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question about camera frames (Alpamayo 1.5 / 2 Super VQA)")
    add_model_args(p)
    p.add_argument("--frames", required=True, help="directory with one sub-directory of 4 frames per camera")
    p.add_argument("--question", required=True, help="the question, plain text")
    add_request_args(p, samples=False)
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap (default 256)")
    p.add_argument("--json", action="store_true", help="print one JSON object: family, answer, token_ids")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    frames, times = read_frames(args.frames)
    vla = load_vla(args)
    try:
        answer = vla.ask(
            frames, args.question, seed=args.seed, frame_times_ns=times, max_new_tokens=args.max_new_tokens
        )
    finally:
        vla.close()
    if args.json:
        out = {"family": vla.family.name, "answer": answer.text, "token_ids": answer.token_ids}
        print(json.dumps(out | {"capped": answer.capped, "timings_ms": answer.timings_ms}))
        return 0
    print(vla.model_line())
    capped = ", length cap reached" if answer.capped else ""
    print(f"answer ({len(answer.token_ids)} tokens{capped}): {answer.text}")
    return 0

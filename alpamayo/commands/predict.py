"""`alpamayo predict`: one driving prediction from a frames directory and an ego-history CSV."""

from __future__ import annotations

import argparse
import json

from alpamayo.commands.common import add_model_args, add_request_args, model_spec
from alpamayo.inputs import read_ego_csv, read_frames
from alpamayo.runtime import AlpamayoVLA


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="reasoning and 64 waypoints from camera frames and ego history files")
    add_model_args(p)
    p.add_argument("--frames", required=True, help="directory with one sub-directory of 4 frames per camera")
    p.add_argument("--ego", required=True, help="CSV of 16 ego poses: t_ns,x,y,z,qx,qy,qz,qw")
    p.add_argument("--route", help="optional navigation text, e.g. 'Turn left in 40 m'")
    add_request_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # the sample count is refused before the frames are read, and those before the model loads
    spec = model_spec(args)
    spec.check_samples(args.samples)
    frames, times = read_frames(args.frames)
    ego = read_ego_csv(args.ego)
    vla = AlpamayoVLA.from_spec(spec)
    try:
        pred = vla.predict(
            frames, ego, route=args.route, num_samples=args.samples, seed=args.seed, frame_times_ns=times
        )
    finally:
        vla.close()
    if args.json:
        print(
            json.dumps(
                {
                    "family": vla.family.name,
                    "decoder": pred.decoder,
                    "flow": pred.flow,
                    "draft": pred.draft,
                    "accepted_lengths": pred.accepted_lengths,
                    "t_s": pred.t_s.round(3).tolist(),
                    "samples": [
                        {
                            "reasoning": s.reasoning,
                            "reasoning_token_ids": s.reasoning_token_ids,
                            "reasoning_capped": s.reasoning_capped,
                            "trajectory_token_ids": s.token_ids,
                            "actions": s.actions.tolist(),
                            "xyz": s.xyz.tolist(),
                            "heading": s.heading.tolist(),
                        }
                        for s in pred.samples
                    ],
                    "timings_ms": pred.timings_ms,
                }
            )
        )
        return 0
    print(vla.model_line())
    for k, s in enumerate(pred.samples):
        # The token count beside the text: special tokens are not printed, so the random demo checkpoint's
        # reasoning (vision pads until the cap) reads as '' although it ran to the cap.
        capped = ", length cap reached" if s.reasoning_capped else ""
        print(f"sample {k}: reasoning ({len(s.reasoning_token_ids)} tokens{capped}): {s.reasoning!r}")
        print(f"  {'t [s]':>6} {'x [m]':>8} {'y [m]':>8} {'z [m]':>7} {'heading [rad]':>14}")
        for t, (x, y, z), h in zip(pred.t_s, s.xyz, s.heading, strict=True):
            print(f"  {t:6.1f} {x:8.2f} {y:8.2f} {z:7.2f} {h:14.3f}")
    print("timings [ms]: " + ", ".join(f"{k} {v:.1f}" for k, v in pred.timings_ms.items()))
    return 0
